"""pytest settings shared by every test file."""


def pytest_collection_modifyitems(items):
  # tf.test.TestCase has a helper named test_session, which pytest collects
  # as a test and reports as skipped ("Not a test."): it is not one.
  items[:] = [item for item in items if item.name != "test_session"]
