// AVX-512 kernels: the LSTM's per-step recurrent product [M, K] x [K, N]
// with M (the batch) small, and the softmax layer's cross-entropy over the
// logits (SoftmaxCrossEntropy, at the end). kernels.py says why and
// builds them.
//
// PackPanels copies the weight matrix once per training step into panels of
// 32 columns, each [K, 32] contiguous; PanelMatMul then reads each panel as
// one stream and keeps a 10-row x 32-column tile of the product in 20
// AVX-512 registers for the whole K loop. While it works on a panel it
// prefetches the next one, spread evenly over its passes (one per 10 rows).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tensorflow {
namespace {

constexpr int64_t kPanel = 32;     // columns per panel: two 16-float registers
constexpr int kRows = 10;          // rows per tile: 20 accumulators
constexpr int64_t kPrefetch = 32;  // panel rows (of 128 bytes) ahead

// c[:R, :32] = a[:R, :] @ panel + x[:R, :32] for one panel [K, 32],
// the columns beyond the matrix masked off by m0 (first 16) and m1. At each
// k it also prefetches kLines cache lines from `next` on (see PanelTiles).
template <int R, int kLines>
__attribute__((target("avx512f"))) void Tile(
    const float* a, int64_t lda, const float* panel, int64_t K,
    const float* x, float* c, int64_t ldc, __mmask16 m0, __mmask16 m1,
    uintptr_t next) {
  __m512 acc0[R], acc1[R];
  for (int r = 0; r < R; ++r) {
    acc0[r] = _mm512_setzero_ps();
    acc1[r] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < K; ++k) {
    // Addresses, not pointers: the prefetches of the last rows and of the
    // last panel's successor point past the panels, which is harmless.
    const uintptr_t ahead = reinterpret_cast<uintptr_t>(panel) +
                            sizeof(float) * kPanel * (k + kPrefetch);
    _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(ahead + 64), _MM_HINT_T0);
    const uintptr_t line = next + 64 * kLines * k;
    _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
    if (kLines == 2) {
      _mm_prefetch(reinterpret_cast<const char*>(line + 64), _MM_HINT_T0);
    }
    const __m512 b0 = _mm512_loadu_ps(panel + kPanel * k);
    const __m512 b1 = _mm512_loadu_ps(panel + kPanel * k + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 av = _mm512_set1_ps(a[r * lda + k]);
      acc0[r] = _mm512_fmadd_ps(av, b0, acc0[r]);
      acc1[r] = _mm512_fmadd_ps(av, b1, acc1[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    const float* xr = x + r * ldc;
    float* cr = c + r * ldc;
    const __m512 x0 = _mm512_maskz_loadu_ps(m0, xr);
    const __m512 x1 = _mm512_maskz_loadu_ps(m1, xr + 16);
    _mm512_mask_storeu_ps(cr, m0, _mm512_add_ps(acc0[r], x0));
    _mm512_mask_storeu_ps(cr + 16, m1, _mm512_add_ps(acc1[r], x1));
  }
}

// All M rows of a against one panel, in tiles of kRows rows.
//
// The panels stream from L3 or memory. Prefetching only a panel's own rows
// ahead, the first tile's pass waited for memory (its 20 products per row
// of 128 bytes outrun one core's stream) while the second, from L2, did
// not; the product took 1.2x (medium) to 1.4x (large) as long as with the
// next panel's 2K lines spread over all the passes of this one, one line per
// row and pass (two with a single pass). The rows ahead of each pass are
// still prefetched too (without that, medium's product took 1.06x as long
// again: each shard's first panel, and L2 to L1); with no software
// prefetch at all it had taken 1.25x as long.
template <int kLines>
void PanelTiles(const float* a, int64_t M, int64_t K, const float* panel,
                const float* x, float* c, int64_t ldc, __mmask16 m0,
                __mmask16 m1, uintptr_t next) {
  int64_t m = 0;
  for (; m + kRows <= M; m += kRows, next += 64 * kLines * K) {
    Tile<kRows, kLines>(a + m * K, K, panel, K, x + m * ldc, c + m * ldc,
                        ldc, m0, m1, next);
  }
  const float* ar = a + m * K;
  const float* xr = x + m * ldc;
  float* cr = c + m * ldc;
  switch (M - m) {
#define PTB_TILE_CASE(n)                                                 \
  case n:                                                                \
    Tile<n, kLines>(ar, K, panel, K, xr, cr, ldc, m0, m1, next);         \
    break;
    PTB_TILE_CASE(1) PTB_TILE_CASE(2) PTB_TILE_CASE(3) PTB_TILE_CASE(4)
    PTB_TILE_CASE(5) PTB_TILE_CASE(6) PTB_TILE_CASE(7) PTB_TILE_CASE(8)
    PTB_TILE_CASE(9)
#undef PTB_TILE_CASE
  }
}

void PanelRows(const float* a, int64_t M, int64_t K, const float* panel,
               const float* x, float* c, int64_t ldc, __mmask16 m0,
               __mmask16 m1) {
  const uintptr_t next =
      reinterpret_cast<uintptr_t>(panel) + sizeof(float) * K * kPanel;
  if (M <= kRows) {
    PanelTiles<2>(a, M, K, panel, x, c, ldc, m0, m1, next);
  } else {
    PanelTiles<1>(a, M, K, panel, x, c, ldc, m0, m1, next);
  }
}

__mmask16 Mask(int64_t n) {
  if (n >= 16) return __mmask16(0xFFFF);
  return n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

int64_t NumPanels(int64_t n) { return (n + kPanel - 1) / kPanel; }

void Parallel(OpKernelContext* ctx, int64_t units, int64_t cost,
              const std::function<void(int64_t, int64_t)>& work) {
  auto* threads = ctx->device()->tensorflow_cpu_worker_threads();
  Shard(threads->num_threads, threads->workers, units, cost, work);
}

}  // namespace

REGISTER_OP("PackPanels")
    .Input("w: float")
    .Attr("transpose: bool")
    .Output("panels: float")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      bool transpose;
      TF_RETURN_IF_ERROR(c->GetAttr("transpose", &transpose));
      auto k = c->Dim(c->input(0), transpose ? 1 : 0);
      auto n = c->Dim(c->input(0), transpose ? 0 : 1);
      shape_inference::DimensionHandle p = c->UnknownDim();
      if (c->ValueKnown(n)) p = c->MakeDim(NumPanels(c->Value(n)));
      c->set_output(0, c->MakeShape({p, k, c->MakeDim(kPanel)}));
      return OkStatus();
    })
    .Doc(R"doc(
The right-hand factor B [K, N] of a product, as panels [ceil(N / 32), K, 32]:
panels[p, k, j] = B[k, 32 p + j], zero beyond N. w is B, or B^T [N, K] if
transpose.
)doc");

class PackPanelsOp : public OpKernel {
 public:
  explicit PackPanelsOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("transpose", &transpose_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& w = ctx->input(0);
    OP_REQUIRES(ctx, w.dims() == 2, errors::InvalidArgument("w must be 2-D"));
    const int64_t K = w.dim_size(transpose_ ? 1 : 0);
    const int64_t N = w.dim_size(transpose_ ? 0 : 1);
    const int64_t P = NumPanels(N);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(0, TensorShape({P, K, kPanel}), &out));
    const float* src = w.flat<float>().data();
    float* dst = out->flat<float>().data();
    if (transpose_) {
      // Panel p holds rows n0..n0+31 of w, each read contiguously a block
      // of kBlock columns at a time (the block of the panel stays in L1).
      constexpr int64_t kBlock = 64;
      Parallel(ctx, P, 4 * K * kPanel, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) {
          float* panel = dst + p * K * kPanel;
          const int64_t n0 = p * kPanel, width = std::min(kPanel, N - n0);
          if (width < kPanel) std::fill(panel, panel + K * kPanel, 0.0f);
          for (int64_t k0 = 0; k0 < K; k0 += kBlock) {
            const int64_t k1 = std::min(K, k0 + kBlock);
            for (int64_t j = 0; j < width; ++j) {
              const float* row = src + (n0 + j) * K;
              for (int64_t k = k0; k < k1; ++k) panel[k * kPanel + j] = row[k];
            }
          }
        }
      });
    } else {
      // Row k of w is read once, contiguously, and scattered to the panels.
      Parallel(ctx, K, 4 * N, [&](int64_t k0, int64_t k1) {
        for (int64_t k = k0; k < k1; ++k) {
          const float* row = src + k * N;
          for (int64_t p = 0; p < P; ++p) {
            float* out = dst + (p * K + k) * kPanel;
            const int64_t n0 = p * kPanel, width = std::min(kPanel, N - n0);
            std::copy(row + n0, row + n0 + width, out);
            std::fill(out + width, out + kPanel, 0.0f);
          }
        }
      });
    }
  }

 private:
  bool transpose_;
};

REGISTER_KERNEL_BUILDER(Name("PackPanels").Device(DEVICE_CPU), PackPanelsOp);

REGISTER_OP("PanelMatMul")
    .Input("a: float")
    .Input("panels: float")
    .Input("addend: float")
    .Output("c: float")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(2));
      return OkStatus();
    })
    .Doc(R"doc(
c [M, N] = a [M, K] @ B + addend, B [K, N] given as PackPanels' panels.
)doc");

class PanelMatMulOp : public OpKernel {
 public:
  explicit PanelMatMulOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES(ctx, __builtin_cpu_supports("avx512f"),
                errors::Unimplemented("PanelMatMul needs a CPU with AVX-512"));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& a = ctx->input(0);
    const Tensor& panels = ctx->input(1);
    const Tensor& addend = ctx->input(2);
    OP_REQUIRES(
        ctx, a.dims() == 2 && panels.dims() == 3 && addend.dims() == 2,
        errors::InvalidArgument("a, panels, addend must be 2-D, 3-D, 2-D"));
    const int64_t M = a.dim_size(0), K = a.dim_size(1);
    const int64_t N = addend.dim_size(1);
    OP_REQUIRES(ctx,
                panels.dim_size(0) == NumPanels(N) &&
                    panels.dim_size(1) == K && panels.dim_size(2) == kPanel &&
                    addend.dim_size(0) == M,
                errors::InvalidArgument(
                    "shapes do not match: a ", a.shape().DebugString(),
                    ", panels ", panels.shape().DebugString(), ", addend ",
                    addend.shape().DebugString()));
    Tensor* c = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({M, N}), &c));
    const float* ap = a.flat<float>().data();
    const float* pp = panels.flat<float>().data();
    const float* xp = addend.flat<float>().data();
    float* cp = c->flat<float>().data();
    const int64_t cost = 2 * M * K * kPanel;
    Parallel(ctx, NumPanels(N), cost, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t n0 = p * kPanel, width = N - n0;
        PanelRows(ap, M, K, pp + p * K * kPanel, xp + n0, cp + n0, N,
                  Mask(width), Mask(width - 16));
      }
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("PanelMatMul").Device(DEVICE_CPU), PanelMatMulOp);

namespace {

// exp(x) for x <= 88.7, 16 lanes: Cephes' expf (2^n e^r with |r| <= ln2 / 2
// and a degree-7 polynomial for e^r). x under -103.9 counts as -103.9,
// where exp is the smallest denormal float; NaN stays NaN.
__attribute__((target("avx512f"))) __m512 Exp(__m512 x) {
  // max returns its second operand when one is NaN: x, so NaN stays NaN.
  x = _mm512_max_ps(_mm512_set1_ps(-103.9f), x);
  const __m512 n = _mm512_roundscale_ps(
      _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r);
  y = _mm512_add_ps(y, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

// One row: z = logits + b, written to out; then out = softmax(z) - onehot.
// Returns the loss logsumexp(z) - z[label]. The row (40 KB for 10,000
// words) stays in L1 between the three passes. A NaN in z makes the whole
// row NaN, loss included, as TensorFlow's softmax does (the training loop
// stops on a NaN cost).
__attribute__((target("avx512f"))) float XentRow(const float* logits,
                                                  const float* b, int64_t V,
                                                  int64_t label, float* out) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  __mmask16 nan = 0;
  for (int64_t v = 0; v < V; v += 16) {
    const __mmask16 m = Mask(V - v);
    const __m512 z = _mm512_add_ps(_mm512_maskz_loadu_ps(m, logits + v),
                                   _mm512_maskz_loadu_ps(m, b + v));
    _mm512_mask_storeu_ps(out + v, m, z);
    mx = _mm512_mask_max_ps(mx, m, mx, z);
    nan |= _mm512_cmp_ps_mask(z, z, _CMP_UNORD_Q);
  }
  const float top = nan ? NAN : _mm512_reduce_max_ps(mx);
  const float target = out[label];
  const __m512 t = _mm512_set1_ps(top);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t v = 0; v < V; v += 16) {
    const __mmask16 m = Mask(V - v);
    const __m512 e = _mm512_maskz_mov_ps(
        m, Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, out + v), t)));
    _mm512_mask_storeu_ps(out + v, m, e);
    sum = _mm512_add_ps(sum, e);
  }
  const float total = _mm512_reduce_add_ps(sum);
  const __m512 scale = _mm512_set1_ps(1.0f / total);
  for (int64_t v = 0; v < V; v += 16) {
    const __mmask16 m = Mask(V - v);
    _mm512_mask_storeu_ps(
        out + v, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, out + v), scale));
  }
  out[label] -= 1.0f;
  return std::log(total) + (top - target);
}

}  // namespace

REGISTER_OP("SoftmaxCrossEntropy")
    .Input("logits: float")
    .Input("b: float")
    .Input("labels: int32")
    .Output("loss: float")
    .Output("d_logits: float")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Vector(c->Dim(c->input(0), 0)));
      c->set_output(1, c->input(0));
      return OkStatus();
    })
    .Doc(R"doc(
With z = logits [N, V] + b [V]: loss[n] = logsumexp(z[n]) - z[n, labels[n]]
and d_logits = softmax(z) - onehot(labels), the gradient of sum(loss) by z.
d_logits takes the logits' buffer when nothing else holds it.
)doc");

class SoftmaxCrossEntropyOp : public OpKernel {
 public:
  explicit SoftmaxCrossEntropyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES(
        ctx, __builtin_cpu_supports("avx512f"),
        errors::Unimplemented("SoftmaxCrossEntropy needs a CPU with AVX-512"));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& logits = ctx->input(0);
    const Tensor& b = ctx->input(1);
    const Tensor& labels = ctx->input(2);
    OP_REQUIRES(ctx,
                logits.dims() == 2 && b.dims() == 1 && labels.dims() == 1 &&
                    b.dim_size(0) == logits.dim_size(1) &&
                    labels.dim_size(0) == logits.dim_size(0),
                errors::InvalidArgument(
                    "shapes do not match: logits ",
                    logits.shape().DebugString(), ", b ",
                    b.shape().DebugString(), ", labels ",
                    labels.shape().DebugString()));
    const int64_t N = logits.dim_size(0), V = logits.dim_size(1);
    const auto lp = labels.flat<int32_t>();
    for (int64_t n = 0; n < N; ++n) {
      OP_REQUIRES(ctx, lp(n) >= 0 && lp(n) < V,
                  errors::InvalidArgument("label ", lp(n), " of row ", n,
                                          " is outside [0, ", V, ")"));
    }
    Tensor* loss = nullptr;
    Tensor* d_logits = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({N}), &loss));
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output(
                            {0}, 1, logits.shape(), &d_logits));
    const float* in = logits.flat<float>().data();
    const float* bp = b.flat<float>().data();
    float* out = d_logits->flat<float>().data();
    float* lossp = loss->flat<float>().data();
    Parallel(ctx, N, 20 * V, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        lossp[n] = XentRow(in + n * V, bp, V, lp(n), out + n * V);
      }
    });
  }
};

REGISTER_KERNEL_BUILDER(Name("SoftmaxCrossEntropy").Device(DEVICE_CPU),
                        SoftmaxCrossEntropyOp);

}  // namespace tensorflow
