"""The internals of ptb_word_lm.py, one module per mechanism.

The modules, each with what it holds, are listed in docs/design.md ("The
package ptb/, module by module").
"""
