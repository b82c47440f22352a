// Vector kernels: the LSTM's per-step recurrent product [M, K] x [K, N]
// with M (the batch) small, the LSTM cell's elementwise part in one op
// (LstmCell: BLOCK's cell on the CPU), the softmax layer's cross-entropy
// over the logits (SoftmaxCrossEntropy), the SGD update by a gradient of
// few rows x^T @ g applied in place (ApplyOuterProduct), and the machine's
// limits for benchmark.py: the FMA units' peak (FmaPeak) and the memory
// bandwidth (StreamTriad); and the bfloat16 products' peak (Bf16Peak:
// VDPBF16PS or AMX tiles, outside the two widths, below them). kernels.py
// says why and builds them.
//
// PackPanels copies the weight matrix once per training step into panels of
// 32 columns, each [K, 32] contiguous; PanelMatMul then reads each panel as
// one stream and keeps a tile of the product, a few rows x 32 columns, in
// registers for the whole K loop. While it works on a panel it prefetches
// the next one, spread over its first passes (one pass per tile of rows).
//
// The kernels are written once, over a small vector layer `V` (below), and
// compiled once per vector width, each copy with its own target:
//   avx512: 16 floats a register, 32 registers: tiles of 10 rows x 2
//           vectors (20 accumulators), masked tails in mask registers;
//   avx2:   8 floats a register (AVX2 with FMA), 16 registers: tiles of
//           3 rows x 4 vectors (12 accumulators, the broadcast and the
//           panel's vectors in the other 4), tails through lane masks.
// The file includes itself for that: the first pass (PTB_KERNELS_BODY
// undefined) holds the common code and the ops and includes the second part
// (the kernels over V) twice, in a `#pragma GCC target` region and a
// namespace per width. A template over the width could not do it: GCC takes
// a function's target from its definition, and intrinsics inline only into
// functions of their target. The ops pick the width when they are
// constructed (attribute isa, or $PTB_KERNEL_ISA, or the widest this CPU
// has) and refuse one that the CPU cannot run.
#ifndef PTB_KERNELS_BODY

#include <cpuid.h>
#include <immintrin.h>

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace tensorflow {
namespace {

constexpr int64_t kPanel = 32;     // columns per panel (128 bytes a row)
constexpr int64_t kPrefetch = 32;  // panel rows (of 128 bytes) ahead

int64_t NumPanels(int64_t n) { return (n + kPanel - 1) / kPanel; }

// The prefetches of a panel tile's row k (PanelMatMul's and
// PanelMatMulBf16's rows are both 128 bytes): the panel's own row kPrefetch
// ahead, and kLines lines of the next panel from `next` (PanelTiles says
// why). Addresses, not pointers: the prefetches of the last rows and of the
// last panel's successor point past the panels, which is harmless.
template <int kLines>
inline void PrefetchPanelRow(uintptr_t panel, int64_t k, uintptr_t next) {
  const uintptr_t ahead = panel + 128 * (k + kPrefetch);
  _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(ahead + 64), _MM_HINT_T0);
  const uintptr_t line = next + 64 * kLines * k;
  _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
  if (kLines == 2) {
    _mm_prefetch(reinterpret_cast<const char*>(line + 64), _MM_HINT_T0);
  }
}

void Parallel(OpKernelContext* ctx, int64_t units, int64_t cost,
              const std::function<void(int64_t, int64_t)>& work) {
  auto* threads = ctx->device()->tensorflow_cpu_worker_threads();
  Shard(threads->num_threads, threads->workers, units, cost, work);
}

// The kernels' signatures, the same for every width.
using PanelRowsFn = void (*)(const float* a, int64_t M, int64_t K,
                             const float* panel, const float* x, float* c,
                             int64_t ldc, int64_t width);
using XentRowFn = float (*)(const float* logits, const float* b, int64_t n,
                            int64_t label, float* out);
using CellRowFn = void (*)(const float* gates, const float* cs_prev,
                           int64_t hidden, float* const* out);
// The peak ops' register work: `iterations` rounds, returning a checksum.
using ChainsFn = float (*)(int64_t iterations);
using TriadFn = void (*)(const float* b, const float* c, float* a, int64_t n);
using OuterBlockFn = void (*)(const float* x, int64_t M, int64_t K,
                              const float* g, int64_t N, float alpha,
                              float* w, int64_t k0, int64_t k1);

// Stands for a whole vector where the kernels take a tail's lane mask.
struct Full {};

// Put before the loops over a register tile (rows x vectors): GCC then
// unrolls them before it splits the tile's array into registers, and the
// accumulators no longer pass through the stack between the loops
// (ApplyOuterProduct 5 to 10 % faster on the Zen 4).
#define PTB_TILE_LOOP _Pragma("GCC unroll 16")

}  // namespace
}  // namespace tensorflow

#define PTB_KERNELS_BODY

#pragma GCC push_options
#pragma GCC target("avx512f")
namespace tensorflow {
namespace {
namespace avx512 {

struct V {
  using T = __m512;
  using Mask = __mmask16;   // the lanes of a partial vector
  using Flags = __mmask16;  // lanes seen NaN
  static constexpr int kWidth = 16;
  static constexpr int kRows = 10;  // 20 accumulators of the 32 registers
  static constexpr int kOuterRows = 6;  // ApplyOuterProduct's tile
  static constexpr int kOuterVectors = 4;
  // Independent FMA chains of FmaPeak: more than FMA units x latency
  // (2 x 4 on the CPUs seen), fewer than the registers.
  static constexpr int kChains = 16;

  static T Zero() { return _mm512_setzero_ps(); }
  static T Set1(float x) { return _mm512_set1_ps(x); }
  static T Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static Mask FirstLanes(int64_t n) {
    if (n >= kWidth) return Mask(0xFFFF);
    return n <= 0 ? Mask(0) : Mask((1u << n) - 1);
  }
  static T LoadMasked(const float* p, Mask m) {
    return _mm512_maskz_loadu_ps(m, p);
  }
  static void StoreMasked(float* p, T v, Mask m) {
    _mm512_mask_storeu_ps(p, m, v);
  }
  static T Add(T a, T b) { return _mm512_add_ps(a, b); }
  static T Sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T Mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T Div(T a, T b) { return _mm512_div_ps(a, b); }
  // The second operand where either is NaN (as the instruction does).
  static T Min(T a, T b) { return _mm512_min_ps(a, b); }
  // max returns its second operand when one is NaN.
  static T Max(T a, T b) { return _mm512_max_ps(a, b); }
  static T MaxMasked(T acc, T z, Mask m) {
    return _mm512_mask_max_ps(acc, m, acc, z);
  }
  static T ZeroOutside(T v, Mask m) { return _mm512_maskz_mov_ps(m, v); }
  static T FMAdd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T FNMAdd(T a, T b, T c) { return _mm512_fnmadd_ps(a, b, c); }
  static T Round(T x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT |
                                       _MM_FROUND_NO_EXC);
  }
  // y 2^n for integral n.
  static T Scale2(T y, T n) { return _mm512_scalef_ps(y, n); }
  static Flags NoFlags() { return 0; }
  static Flags FlagNan(Flags f, T z) {
    return f | _mm512_cmp_ps_mask(z, z, _CMP_UNORD_Q);
  }
  static bool Any(Flags f) { return f != 0; }
  static float ReduceMax(T v) { return _mm512_reduce_max_ps(v); }
  static float ReduceAdd(T v) { return _mm512_reduce_add_ps(v); }
};

#include __FILE__

}  // namespace avx512
}  // namespace
}  // namespace tensorflow
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace tensorflow {
namespace {
namespace avx2 {

struct V {
  using T = __m256;
  // AVX2 has no mask registers: a lane is in when its int is all ones,
  // as _mm256_maskload_ps and _mm256_maskstore_ps take it.
  using Mask = __m256i;
  using Flags = __m256;
  static constexpr int kWidth = 8;
  // 12 accumulators of the 16 registers: 3 rows x 4 vectors (a panel row),
  // the other 4 for the broadcast of a and the panel's vectors.
  static constexpr int kRows = 3;
  static constexpr int kOuterRows = 4;  // ApplyOuterProduct's tile
  static constexpr int kOuterVectors = 3;
  // FmaPeak's chains: 2 FMA units x latency 5 (Zen 3) = 10 in flight; the
  // other registers hold the two operands.
  static constexpr int kChains = 12;

  static T Zero() { return _mm256_setzero_ps(); }
  static T Set1(float x) { return _mm256_set1_ps(x); }
  static T Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static Mask FirstLanes(int64_t n) {
    const int lanes = static_cast<int>(std::max<int64_t>(
        0, std::min<int64_t>(n, kWidth)));
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static T LoadMasked(const float* p, Mask m) {
    return _mm256_maskload_ps(p, m);
  }
  static void StoreMasked(float* p, T v, Mask m) {
    _mm256_maskstore_ps(p, m, v);
  }
  static T Add(T a, T b) { return _mm256_add_ps(a, b); }
  static T Sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T Mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T Div(T a, T b) { return _mm256_div_ps(a, b); }
  // The second operand where either is NaN (as the instruction does).
  static T Min(T a, T b) { return _mm256_min_ps(a, b); }
  // max returns its second operand when one is NaN.
  static T Max(T a, T b) { return _mm256_max_ps(a, b); }
  static T MaxMasked(T acc, T z, Mask m) {
    return _mm256_blendv_ps(acc, _mm256_max_ps(acc, z),
                            _mm256_castsi256_ps(m));
  }
  static T ZeroOutside(T v, Mask m) {
    return _mm256_and_ps(v, _mm256_castsi256_ps(m));
  }
  static T FMAdd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T FNMAdd(T a, T b, T c) { return _mm256_fnmadd_ps(a, b, c); }
  static T Round(T x) {
    return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // y 2^n for integral n, as scalef does it: AVX2 has no scalef, so the
  // power is built in the exponent bits. n reaches -150 (exp's clamp) and
  // 128, beyond a normal float's exponent, so it is applied in two halves
  // of at most 75: y 2^h is exact (y is near 1) and the second product
  // rounds once, to a denormal where the result is one, as scalef does.
  // A NaN n makes garbage powers, but then y is NaN too.
  static T Scale2(T y, T n) {
    const __m256i i = _mm256_cvtps_epi32(n);
    const __m256i h = _mm256_srai_epi32(i, 1);
    return _mm256_mul_ps(_mm256_mul_ps(y, Pow2(h)),
                         Pow2(_mm256_sub_epi32(i, h)));
  }
  static Flags NoFlags() { return _mm256_setzero_ps(); }
  static Flags FlagNan(Flags f, T z) {
    return _mm256_or_ps(f, _mm256_cmp_ps(z, z, _CMP_UNORD_Q));
  }
  static bool Any(Flags f) { return _mm256_movemask_ps(f) != 0; }
  static float ReduceMax(T v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v),
                          _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
  }
  static float ReduceAdd(T v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v),
                          _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }

 private:
  // 2^e for -126 <= e <= 127.
  static T Pow2(__m256i e) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127)), 23));
  }
};

#include __FILE__

}  // namespace avx2
}  // namespace
}  // namespace tensorflow
#pragma GCC pop_options

#undef PTB_KERNELS_BODY

// Bf16Peak's kernels, one per unit, each in a target region of its own as
// the widths are, so that the library compiles and loads on any x86-64 CPU
// (the op runs a unit only where CpuBf16Units finds it). They are not
// written over V: neither is a vector width of the kernels above.
//
// FLOPs are counted as FmaPeak counts them: a multiply and an add for every
// product, 2 FLOPs a product (an FMA lane is one product, 2 FLOPs).
// VDPBF16PS adds to each of its 16 float lanes the two products of a pair
// of bfloat16s: 32 products, 64 FLOPs. TDPBF16PS on full tiles (16 rows of
// 64 bytes) adds to each of the 16 x 16 floats of its accumulator a row of
// 16 pairs (32 bfloat16s) times a column of as many: 16 x 16 x 32 products,
// 16,384 FLOPs (Intel's pseudocode: the accumulator's rows x its colsb / 4
// floats x the source's colsb / 4 pairs x 2).
//
// Every bfloat16 operand is 2^-10 (0x3A80, the top half of the float), so
// every product is 2^-20: over a test's few iterations the sums are exact,
// and over a long run they grow until what they add is half an ulp or less
// and stay there: finite, and never denormal (both instructions flush
// denormals to zero).
namespace tensorflow {
namespace {
constexpr uint16_t kBf16Operand = 0x3A80;

// The bfloat16 panels (PackPanelsBf16, PanelMatMulBf16): B [K, N] in
// panels of 32 columns as PackPanels makes them, each element rounded to
// bfloat16 and two consecutive k of a column in one 32-bit word (the even
// k in the low half), as VDPBF16PS takes its operands: panels [ceil(N /
// 32), ceil(K / 2), 32] of words, zero beyond K and N.
using PairRowsFn = void (*)(const uint32_t* a, int64_t M, int64_t Kp,
                            const uint32_t* panel, const float* x, float* c,
                            int64_t ldc, int64_t width);
// n floats rounded to n bfloat16s (RoundRowFn); and n pairs of floats,
// even[j] and odd[j], rounded to n words of two bfloat16s (PairRowFn).
using RoundRowFn = void (*)(const float* src, int64_t n, uint16_t* dst);
using PairRowFn = void (*)(const float* even, const float* odd, int64_t n,
                           uint32_t* dst);

int64_t NumPairs(int64_t k) { return (k + 1) / 2; }

// float to bfloat16 as VCVTNEPS2BF16 rounds it: to nearest, ties to even;
// a NaN to a quiet NaN; a denormal to a zero of its sign (denormal inputs
// count as zero).
uint16_t ToBf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  if ((b & 0x7F800000u) == 0) return static_cast<uint16_t>((b >> 16) & 0x8000u);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<uint16_t>((b >> 16) | 0x0040u);
  }
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

uint32_t Bf16Pair(float even, float odd) {
  return uint32_t{ToBf16(even)} | (uint32_t{ToBf16(odd)} << 16);
}

// The rounding of whole rows in scalar code: the reference of the vector
// unit's RoundRow and PairRow, and the path of CPUs without it.
void ScalarRoundRow(const float* src, int64_t n, uint16_t* dst) {
  for (int64_t j = 0; j < n; ++j) dst[j] = ToBf16(src[j]);
}

void ScalarPairRow(const float* even, const float* odd, int64_t n,
                   uint32_t* dst) {
  for (int64_t j = 0; j < n; ++j) dst[j] = Bf16Pair(even[j], odd[j]);
}

float FromBf16(uint32_t h) {
  const uint32_t b = (h & 0xFFFFu) << 16;
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

float FlushDenormal(float f) {
  return std::fpclassify(f) == FP_SUBNORMAL ? std::copysign(0.0f, f) : f;
}

// One lane of VDPBF16PS, as Intel's pseudocode writes it: acc plus the
// product of the odd halves, then plus that of the even halves, each an
// FMA rounded to nearest even once, denormal inputs taken as zero and
// denormal results flushed to zero.
float DotPair(float acc, uint32_t a, uint32_t b) {
  const float a0 = FlushDenormal(FromBf16(a)), a1 = FlushDenormal(FromBf16(a >> 16));
  const float b0 = FlushDenormal(FromBf16(b)), b1 = FlushDenormal(FromBf16(b >> 16));
  acc = FlushDenormal(std::fma(a1, b1, FlushDenormal(acc)));
  return FlushDenormal(std::fma(a0, b0, acc));
}

// PairRows in scalar code, lane by lane in the instruction's order: the
// portable reference of the vector kernel (unit "scalar"), which tests the
// packing, the tails and the indexing on any CPU.
void ScalarPairRows(const uint32_t* a, int64_t M, int64_t Kp,
                    const uint32_t* panel, const float* x, float* c,
                    int64_t ldc, int64_t width) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t j = 0; j < std::min(width, kPanel); ++j) {
      float acc = 0.0f;
      for (int64_t kp = 0; kp < Kp; ++kp) {
        acc = DotPair(acc, a[m * Kp + kp], panel[kp * kPanel + j]);
      }
      c[m * ldc + j] = acc + x[m * ldc + j];
    }
  }
}

}  // namespace
}  // namespace tensorflow

#pragma GCC push_options
#pragma GCC target("avx512bf16,avx512f,avx512bw,avx512vl")
namespace tensorflow {
namespace {
namespace bf16_avx512 {

// Independent chains, as many as FmaPeak's AVX-512 width runs: enough
// wherever VDPBF16PS's units and latency are like the FMA's, and with the
// operand fewer than the 32 registers.
constexpr int kChains = 16;
constexpr int kLanes = 16;
constexpr double kFlopsPerIteration = 2.0 * 2 * kLanes * kChains;

// Bf16Peak's work on one thread with VDPBF16PS: `iterations` rounds of
// kChains chains acc += x . x (a pair of products a lane), in registers; a
// ChainsFn. Chain i starts at i / 1024 in every lane. Returns the sum of
// all lanes, which the op reports, so that no chain can be dropped.
float DotChains(int64_t iterations) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(i / 1024.0f);
  __m512i pairs = _mm512_set1_epi32(static_cast<int>(
      (uint32_t{kBf16Operand} << 16) | kBf16Operand));
  // The operand's value hidden from the compiler, which then cannot work
  // out the chains itself.
  __asm__("" : "+v"(pairs));
  const __m512bh x = reinterpret_cast<__m512bh>(pairs);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], x, x);
  }
  __m512 sum = _mm512_setzero_ps();
  for (int i = 0; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  return _mm512_reduce_add_ps(sum);
}


// The bfloat16 panels' product on VDPBF16PS (PanelMatMulBf16): a tile of
// R rows x the panel's 32 columns in 2R accumulators, as the float32
// kernels' tile, over the K pairs. a's rows come as pairs of bfloat16 (one
// 32-bit word a pair, the even k in the low half), which a broadcast puts
// in every lane; the panel's row of pairs is two vectors of 16 lanes.
// c = the product + x, stored to the first `width` columns. The panel's
// rows of pairs are 128 bytes, as the float32 panels' rows: the tile
// prefetches its own rows ahead and kLines lines of the next panel a row,
// as the float32 Tile does (PanelTiles says why).
template <int R, int kLines>
void PairTile(const uint32_t* a, int64_t Kp, const uint32_t* panel,
              const float* x, float* c, int64_t ldc, int64_t width,
              uintptr_t next) {
  __m512 acc[R][2];
  PTB_TILE_LOOP
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < Kp; ++kp) {
    PrefetchPanelRow<kLines>(reinterpret_cast<uintptr_t>(panel), kp, next);
    const uint32_t* row = panel + kp * kPanel;
    const __m512bh w0 =
        reinterpret_cast<__m512bh>(_mm512_loadu_si512(row));
    const __m512bh w1 =
        reinterpret_cast<__m512bh>(_mm512_loadu_si512(row + kLanes));
    PTB_TILE_LOOP
    for (int r = 0; r < R; ++r) {
      const __m512bh ar = reinterpret_cast<__m512bh>(
          _mm512_set1_epi32(static_cast<int>(a[r * Kp + kp])));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], ar, w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], ar, w1);
    }
  }
  const __mmask16 m0 = width >= kLanes ? 0xFFFF : (1u << width) - 1;
  const int64_t rest = width - kLanes;
  const __mmask16 m1 = rest >= kLanes ? 0xFFFF
                       : rest <= 0    ? 0
                                      : (1u << rest) - 1;
  PTB_TILE_LOOP
  for (int r = 0; r < R; ++r) {
    const float* xr = x + r * ldc;
    float* cr = c + r * ldc;
    _mm512_mask_storeu_ps(
        cr, m0, _mm512_add_ps(acc[r][0], _mm512_maskz_loadu_ps(m0, xr)));
    _mm512_mask_storeu_ps(cr + kLanes, m1,
                          _mm512_add_ps(acc[r][1],
                                        _mm512_maskz_loadu_ps(m1, xr + kLanes)));
  }
}

// RoundRow with VCVTNEPS2BF16, 16 floats at a time, the tail masked.
void RoundRow(const float* src, int64_t n, uint16_t* dst) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + j),
                        (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(src + j)));
  }
  if (j < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - j)) - 1);
    _mm256_mask_storeu_epi16(
        dst + j, m, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + j)));
  }
}

// PairRow with VCVTNE2PS2BF16, which rounds 16 even and 16 odd floats into
// one vector (the even ones in its low half); a permutation of its 16-bit
// halves (kInterleave: even j, then odd j) puts each beside the other.
alignas(64) constexpr uint16_t kInterleave[2 * kLanes] = {
    0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
    8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

void PairRow(const float* even, const float* odd, int64_t n, uint32_t* dst) {
  const __m512i interleave = _mm512_load_si512(kInterleave);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(
        _mm512_loadu_ps(odd + j), _mm512_loadu_ps(even + j));
    _mm512_storeu_si512(dst + j, _mm512_permutexvar_epi16(interleave, both));
  }
  if (j < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - j)) - 1);
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(
        _mm512_maskz_loadu_ps(m, odd + j), _mm512_maskz_loadu_ps(m, even + j));
    _mm512_mask_storeu_epi32(dst + j, m,
                             _mm512_permutexvar_epi16(interleave, both));
  }
}

constexpr int kPairRows = 10;  // 20 accumulators of the 32 registers

// The rows of a [M, Kp pairs] against one panel [Kp, 32 lanes
// of pairs], in tiles of kPairRows rows, then one of the rows left; each
// pass prefetches its share of the next panel (PanelTiles).
template <int kLines>
void PairPasses(const uint32_t* a, int64_t M, int64_t Kp,
                const uint32_t* panel, const float* x, float* c,
                int64_t ldc, int64_t width, uintptr_t next) {
  constexpr int64_t kCover = 2 / kLines;
  const uintptr_t stride = 64 * kLines * Kp;
  int64_t m = 0, pass = 0;
  for (; m + kPairRows <= M; m += kPairRows, ++pass) {
    PairTile<kPairRows, kLines>(a + m * Kp, Kp, panel, x + m * ldc,
                                c + m * ldc, ldc, width,
                                next + stride * (pass % kCover));
  }
  const uint32_t* am = a + m * Kp;
  const float* xm = x + m * ldc;
  float* cm = c + m * ldc;
  const uintptr_t nm = next + stride * (pass % kCover);
  switch (M - m) {
    case 1: PairTile<1, kLines>(am, Kp, panel, xm, cm, ldc, width, nm); break;
    case 2: PairTile<2, kLines>(am, Kp, panel, xm, cm, ldc, width, nm); break;
    case 3: PairTile<3, kLines>(am, Kp, panel, xm, cm, ldc, width, nm); break;
    case 4: PairTile<4, kLines>(am, Kp, panel, xm, cm, ldc, width, nm); break;
    case 5: PairTile<5, kLines>(am, Kp, panel, xm, cm, ldc, width, nm); break;
    case 6: PairTile<6, kLines>(am, Kp, panel, xm, cm, ldc, width, nm); break;
    case 7: PairTile<7, kLines>(am, Kp, panel, xm, cm, ldc, width, nm); break;
    case 8: PairTile<8, kLines>(am, Kp, panel, xm, cm, ldc, width, nm); break;
    case 9: PairTile<9, kLines>(am, Kp, panel, xm, cm, ldc, width, nm); break;
    default: break;
  }
}

// Every row of a [M, Kp pairs] against one panel; a PairRowsFn.
void PairRows(const uint32_t* a, int64_t M, int64_t Kp,
              const uint32_t* panel, const float* x, float* c, int64_t ldc,
              int64_t width) {
  const uintptr_t next =
      reinterpret_cast<uintptr_t>(panel) + sizeof(uint32_t) * Kp * kPanel;
  if (M <= kPairRows) {
    PairPasses<2>(a, M, Kp, panel, x, c, ldc, width, next);
  } else {
    PairPasses<1>(a, M, Kp, panel, x, c, ldc, width, next);
  }
}

}  // namespace bf16_avx512
}  // namespace
}  // namespace tensorflow
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")
namespace tensorflow {
namespace {
namespace amx {

// LDTILECFG's 64 bytes: palette 1 (tiles of at most 16 rows of 64 bytes),
// start_row 0, then each tile's bytes a row (colsb) and rows; tiles 8 to 15
// and the reserved bytes must be zero.
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

constexpr int kTileRows = 16;
constexpr int kTileBytes = 64;  // a row: 16 floats, or 32 bfloat16s
// Accumulators tmm0-3, sources tmm4-7 (two left, two right factors, as a
// GEMM's 2 x 2 block of tiles): four independent chains, so that a
// TDPBF16PS need not wait for the result of the one before it.
constexpr int kAccumulators = 4;
constexpr double kFlopsPerIteration =
    2.0 * kAccumulators * kTileRows * (kTileBytes / 4) * (kTileBytes / 2);

// The tile instructions are asm statements that do not tell the compiler
// what memory they read (_tile_loadconfig names 8 of the configuration's 64
// bytes, _tile_loadd none): this makes the stores to p's object happen
// before them.
void Publish(const void* p) { __asm__ volatile("" : : "r"(p) : "memory"); }

// Bf16Peak's work on one thread with AMX: configures the tiles (a thread's
// own state), loads the sources, then `iterations` rounds of one TDPBF16PS
// per accumulator; a ChainsFn. Returns the sum of the accumulators'
// floats, and releases the tiles, which leaves the thread as it found it.
// The process must have the kernel's permission for the tile data
// (RequestTileData) before any thread runs this.
float TileChains(int64_t iterations) {
  TileConfig config = {};
  config.palette = 1;
  for (int t = 0; t < 8; ++t) {
    config.colsb[t] = kTileBytes;
    config.rows[t] = kTileRows;
  }
  alignas(64) uint16_t source[kTileRows * kTileBytes / 2];
  std::fill(std::begin(source), std::end(source), kBf16Operand);
  Publish(&config);
  Publish(source);
  _tile_loadconfig(&config);
  _tile_loadd(4, source, kTileBytes);
  _tile_loadd(5, source, kTileBytes);
  _tile_loadd(6, source, kTileBytes);
  _tile_loadd(7, source, kTileBytes);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t it = 0; it < iterations; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float out[kAccumulators][kTileRows * kTileBytes / 4];
  _tile_stored(0, out[0], kTileBytes);
  _tile_stored(1, out[1], kTileBytes);
  _tile_stored(2, out[2], kTileBytes);
  _tile_stored(3, out[3], kTileBytes);
  _tile_release();
  float sum = 0.0f;
  for (const auto& tile : out) {
    for (float x : tile) sum += x;
  }
  return sum;
}

}  // namespace amx
}  // namespace
}  // namespace tensorflow
#pragma GCC pop_options

namespace tensorflow {
namespace {

// The width that an op with attribute `isa` runs: avx512 or avx2, or for
// auto $PTB_KERNEL_ISA if set, else the widest this CPU runs. An error if
// the CPU cannot run it (or $PTB_KERNEL_ISA names no width).
Status ChooseWidth(OpKernelConstruction* ctx, const char* op, bool* wide) {
  std::string isa;
  TF_RETURN_IF_ERROR(ctx->GetAttr("isa", &isa));
  const char* source = "isa";
  if (isa == "auto") {
    const char* env = std::getenv("PTB_KERNEL_ISA");
    isa = env == nullptr ? "" : env;
    source = "PTB_KERNEL_ISA";
  }
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool avx2 =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa.empty()) {
    if (!avx512 && !avx2) {
      return errors::Unimplemented(
          op, " needs a CPU with AVX-512 or with AVX2 and FMA");
    }
    *wide = avx512;
  } else if (isa == "avx512") {
    if (!avx512) {
      return errors::Unimplemented(op, ": ", source,
                                   " is avx512 but the CPU has no AVX-512");
    }
    *wide = true;
  } else if (isa == "avx2") {
    if (!avx2) {
      return errors::Unimplemented(
          op, ": ", source, " is avx2 but the CPU has no AVX2 with FMA");
    }
    *wide = false;
  } else {
    return errors::InvalidArgument(op, ": ", source, " is \"", isa,
                                   "\", not avx512 or avx2");
  }
  return OkStatus();
}

// What CPUID and XCR0 say of Bf16Peak's units: the CPU's instructions
// (cpu), and the OS's saving of their registers' state (os), without which
// they fault. CPUID leaf 7 subleaf 0: EBX bit 16 AVX512F, EDX bit 22
// AMX-BF16 and bit 24 AMX-TILE, EAX the last subleaf; subleaf 1: EAX bit 5
// AVX512_BF16, read only where subleaf 0 says that subleaf 1 exists (some
// CPUs answer an absent subleaf with subleaf 0's bits). XCR0, readable by
// XGETBV where CPUID leaf 1 ECX bit 27 (OSXSAVE) says so: bits 1, 2 and 5
// to 7 the SSE, AVX and AVX-512 state; 17 and 18 the tiles' configuration
// and data.
struct UnitSupport {
  bool cpu = false;
  bool os = false;
};

struct Bf16Units {
  UnitSupport avx512_bf16;
  UnitSupport amx;
};

__attribute__((target("xsave"))) uint64_t ReadXcr0() { return _xgetbv(0); }

Bf16Units CpuBf16Units() {
  Bf16Units units;
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return units;
  const unsigned subleaves = eax, features = ebx, more = edx;
  bool bf16 = false;
  if (subleaves >= 1) {
    __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx);
    bf16 = (eax & bit_AVX512BF16) != 0;
  }
  units.avx512_bf16.cpu = bf16 && (features & bit_AVX512F) != 0;
  units.amx.cpu = (more & bit_AMX_TILE) != 0 && (more & bit_AMX_BF16) != 0;
  uint64_t xcr0 = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_OSXSAVE) != 0) {
    xcr0 = ReadXcr0();
  }
  constexpr uint64_t kAvx512State = (1 << 1) | (1 << 2) | (7 << 5);
  constexpr uint64_t kTileState = (1 << 17) | (1 << 18);
  units.avx512_bf16.os = (xcr0 & kAvx512State) == kAvx512State;
  units.amx.os = (xcr0 & kTileState) == kTileState;
  return units;
}

// The kernel's permission for this process to use the AMX tile data (XSAVE
// component 18): Linux saves those 8 KB of a thread only for processes that
// asked, and kills one that uses the tiles unasked. The permission is the
// whole process's, its threads' (the pool's) included; asking again is
// harmless.
Status RequestTileData() {
#if defined(__linux__)
  constexpr long kReqXcompPerm = 0x1023;  // ARCH_REQ_XCOMP_PERM
  constexpr long kXtileData = 18;         // XFEATURE_XTILEDATA
  if (syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) != 0) {
    return errors::PermissionDenied(
        "Bf16Peak: unit amx: the kernel refused this process the AMX tile "
        "data (arch_prctl ARCH_REQ_XCOMP_PERM: ", std::strerror(errno), ")");
  }
  return OkStatus();
#else
  return errors::Unimplemented("Bf16Peak: unit amx runs on Linux only");
#endif
}

// Bf16Peak's unit for its attribute `unit` (auto: amx where the CPU has
// AMX-BF16, else avx512_bf16 where it has AVX512_BF16); an InvalidArgument
// error, one line, where this CPU or its OS cannot run it.
Status ChooseBf16Unit(const std::string& unit, const Bf16Units& units,
                      std::string* chosen) {
  std::string name = unit;
  if (name == "auto") {
    // A unit that the OS has not enabled is chosen only to say so.
    if (units.amx.cpu && (units.amx.os || !units.avx512_bf16.cpu ||
                          !units.avx512_bf16.os)) {
      name = "amx";
    } else if (units.avx512_bf16.cpu) {
      name = "avx512_bf16";
    } else {
      return errors::InvalidArgument(
          "Bf16Peak: unit auto needs a CPU with AMX-BF16 or AVX512_BF16 "
          "(this one has neither)");
    }
  }
  if (name == "amx") {
    if (!units.amx.cpu) {
      return errors::InvalidArgument(
          "Bf16Peak: unit amx needs a CPU with AMX-BF16 (this one has none)");
    }
    if (!units.amx.os) {
      return errors::InvalidArgument(
          "Bf16Peak: unit amx needs the AMX tile state enabled by the OS "
          "(XCR0 bits 17, 18), which this one has not");
    }
  } else if (name == "avx512_bf16") {
    if (!units.avx512_bf16.cpu) {
      return errors::InvalidArgument(
          "Bf16Peak: unit avx512_bf16 needs a CPU with AVX512_BF16 (this one "
          "has none)");
    }
    if (!units.avx512_bf16.os) {
      return errors::InvalidArgument(
          "Bf16Peak: unit avx512_bf16 needs the AVX-512 state enabled by the "
          "OS (XCR0 bits 5 to 7), which this one has not");
    }
  } else {
    return errors::InvalidArgument("Bf16Peak: unit is \"", unit,
                                   "\", not auto, avx512_bf16 or amx");
  }
  *chosen = name;
  return OkStatus();
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

// PackPanels and PackPanelsBf16: the attribute transpose, and B's sizes.
class PackOp : public OpKernel {
 public:
  explicit PackOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("transpose", &transpose_));
  }

 protected:
  // K and N of B, from w ([K, N], or [N, K] if transpose); false, with
  // the op's error set, if w is not a matrix.
  bool Sizes(OpKernelContext* ctx, const Tensor& w, int64_t* K, int64_t* N) {
    if (w.dims() != 2) {
      ctx->CtxFailure(errors::InvalidArgument("w must be 2-D"));
      return false;
    }
    *K = w.dim_size(transpose_ ? 1 : 0);
    *N = w.dim_size(transpose_ ? 0 : 1);
    return true;
  }

  bool transpose_;
};

// The operands of PanelMatMul and PanelMatMulBf16: a [M, K], panels
// [ceil(N / 32), panel_rows, 32], addend [M, N].
Status CheckPanelOperands(const Tensor& a, const Tensor& panels,
                          const Tensor& addend, int64_t panel_rows) {
  if (a.dims() != 2 || panels.dims() != 3 || addend.dims() != 2) {
    return errors::InvalidArgument("a, panels, addend must be 2-D, 3-D, 2-D");
  }
  if (panels.dim_size(0) != NumPanels(addend.dim_size(1)) ||
      panels.dim_size(1) != panel_rows || panels.dim_size(2) != kPanel ||
      addend.dim_size(0) != a.dim_size(0)) {
    return errors::InvalidArgument(
        "shapes do not match: a ", a.shape().DebugString(), ", panels ",
        panels.shape().DebugString(), ", addend ",
        addend.shape().DebugString());
  }
  return OkStatus();
}

class PackPanelsOp : public PackOp {
 public:
  using PackOp::PackOp;

  void Compute(OpKernelContext* ctx) override {
    const Tensor& w = ctx->input(0);
    int64_t K, N;
    if (!Sizes(ctx, w, &K, &N)) return;
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
};

REGISTER_KERNEL_BUILDER(Name("PackPanels").Device(DEVICE_CPU), PackPanelsOp);

REGISTER_OP("PanelMatMul")
    .Input("a: float")
    .Input("panels: float")
    .Input("addend: float")
    .Attr("isa: {'auto', 'avx512', 'avx2'} = 'auto'")
    .Output("c: float")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(2));
      return OkStatus();
    })
    .Doc(R"doc(
c [M, N] = a [M, K] @ B + addend, B [K, N] given as PackPanels' panels.
isa: the vector width, avx512 or avx2; auto: $PTB_KERNEL_ISA if set, else
the widest this CPU has.
)doc");

class PanelMatMulOp : public OpKernel {
 public:
  explicit PanelMatMulOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    bool wide = false;
    OP_REQUIRES_OK(ctx, ChooseWidth(ctx, "PanelMatMul", &wide));
    rows_ = wide ? &avx512::PanelRows : &avx2::PanelRows;
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& a = ctx->input(0);
    const Tensor& panels = ctx->input(1);
    const Tensor& addend = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckPanelOperands(a, panels, addend,
                                           a.dims() == 2 ? a.dim_size(1) : 0));
    const int64_t M = a.dim_size(0), K = a.dim_size(1);
    const int64_t N = addend.dim_size(1);
    Tensor* c = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({M, N}), &c));
    const float* ap = a.flat<float>().data();
    const float* pp = panels.flat<float>().data();
    const float* xp = addend.flat<float>().data();
    float* cp = c->flat<float>().data();
    const int64_t cost = 2 * M * K * kPanel;
    const PanelRowsFn rows = rows_;
    Parallel(ctx, NumPanels(N), cost, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t n0 = p * kPanel;
        rows(ap, M, K, pp + p * K * kPanel, xp + n0, cp + n0, N, N - n0);
      }
    });
  }

 private:
  PanelRowsFn rows_;
};

REGISTER_KERNEL_BUILDER(Name("PanelMatMul").Device(DEVICE_CPU), PanelMatMulOp);

// The bfloat16 ops' attribute unit, shared by PackPanelsBf16 and
// PanelMatMulBf16: `vector` whether they run the VDPBF16PS unit's code
// (auto: where the CPU and the OS have it), else the same arithmetic in
// scalar code; an error for a unit the CPU lacks.
Status VectorBf16Unit(OpKernelConstruction* ctx, const char* op,
                      bool* vector) {
  std::string unit;
  TF_RETURN_IF_ERROR(ctx->GetAttr("unit", &unit));
  const Bf16Units units = CpuBf16Units();
  *vector = units.avx512_bf16.cpu && units.avx512_bf16.os;
  if (unit == "avx512_bf16" && !*vector) {
    return errors::InvalidArgument(
        op, ": unit avx512_bf16 needs a CPU with AVX512_BF16 and the AVX-512 "
        "state enabled by the OS");
  }
  *vector = *vector && unit != "scalar";
  return OkStatus();
}

REGISTER_OP("PackPanelsBf16")
    .Input("w: float")
    .Attr("transpose: bool")
    .Attr("unit: {'auto', 'avx512_bf16', 'scalar'} = 'auto'")
    .Output("panels: int32")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      bool transpose;
      TF_RETURN_IF_ERROR(c->GetAttr("transpose", &transpose));
      auto k = c->Dim(c->input(0), transpose ? 1 : 0);
      auto n = c->Dim(c->input(0), transpose ? 0 : 1);
      shape_inference::DimensionHandle p = c->UnknownDim(), kp = p;
      if (c->ValueKnown(n)) p = c->MakeDim(NumPanels(c->Value(n)));
      if (c->ValueKnown(k)) kp = c->MakeDim(NumPairs(c->Value(k)));
      c->set_output(0, c->MakeShape({p, kp, c->MakeDim(kPanel)}));
      return OkStatus();
    })
    .Doc(R"doc(
The right-hand factor B [K, N] of a product, rounded to bfloat16 (to
nearest even) and packed for VDPBF16PS: panels [ceil(N / 32), ceil(K / 2),
32] of 32-bit words, word [p, i, j] holding B[2i, 32p + j] in its low half
and B[2i + 1, 32p + j] in its high half, zero beyond K and N. w is B, or
B^T [N, K] if transpose. unit: who rounds, as in PanelMatMulBf16 (the same
bits either way).
)doc");

class PackPanelsBf16Op : public PackOp {
 public:
  explicit PackPanelsBf16Op(OpKernelConstruction* ctx) : PackOp(ctx) {
    bool vector = false;
    OP_REQUIRES_OK(ctx, VectorBf16Unit(ctx, "PackPanelsBf16", &vector));
    round_ = vector ? &bf16_avx512::RoundRow : &ScalarRoundRow;
    pair_ = vector ? &bf16_avx512::PairRow : &ScalarPairRow;
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& w = ctx->input(0);
    int64_t K, N;
    if (!Sizes(ctx, w, &K, &N)) return;
    const int64_t P = NumPanels(N), Kp = NumPairs(K);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(
        ctx, ctx->allocate_output(0, TensorShape({P, Kp, kPanel}), &out));
    const float* src = w.flat<float>().data();
    uint32_t* dst = reinterpret_cast<uint32_t*>(out->flat<int32>().data());
    const RoundRowFn round = round_;
    const PairRowFn pair = pair_;
    if (transpose_) {
      // Panel p holds rows n0..n0+31 of w, whose pairs are adjacent: each
      // row rounded in order is its column's words, then set in place.
      Parallel(ctx, P, 8 * Kp * kPanel, [&](int64_t p0, int64_t p1) {
        std::vector<uint32_t> words(Kp, 0u);
        uint16_t* halves = reinterpret_cast<uint16_t*>(words.data());
        for (int64_t p = p0; p < p1; ++p) {
          uint32_t* panel = dst + p * Kp * kPanel;
          const int64_t n0 = p * kPanel, width = std::min(kPanel, N - n0);
          if (width < kPanel) std::fill(panel, panel + Kp * kPanel, 0u);
          for (int64_t j = 0; j < width; ++j) {
            round(src + (n0 + j) * K, K, halves);  // an odd K's pad stays 0
            for (int64_t i = 0; i < Kp; ++i) panel[i * kPanel + j] = words[i];
          }
        }
      });
    } else {
      // Rows 2i and 2i + 1 of w are read contiguously and paired into
      // every panel's row i.
      Parallel(ctx, Kp, 8 * N, [&](int64_t i0, int64_t i1) {
        std::vector<float> zeros(2 * i1 + 1 >= K ? N : 0, 0.0f);
        for (int64_t i = i0; i < i1; ++i) {
          const float* even = src + 2 * i * N;
          const float* odd = 2 * i + 1 < K ? even + N : zeros.data();
          for (int64_t p = 0; p < P; ++p) {
            uint32_t* out = dst + (p * Kp + i) * kPanel;
            const int64_t n0 = p * kPanel, width = std::min(kPanel, N - n0);
            pair(even + n0, odd + n0, width, out);
            std::fill(out + width, out + kPanel, 0u);
          }
        }
      });
    }
  }

 private:
  RoundRowFn round_;
  PairRowFn pair_;
};

REGISTER_KERNEL_BUILDER(Name("PackPanelsBf16").Device(DEVICE_CPU),
                        PackPanelsBf16Op);

REGISTER_OP("TransposeBf16")
    .Input("a: float")
    .Attr("unit: {'auto', 'avx512_bf16', 'scalar'} = 'auto'")
    .Output("t: bfloat16")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      shape_inference::ShapeHandle a;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &a));
      c->set_output(0, c->Matrix(c->Dim(a, 1), c->Dim(a, 0)));
      return OkStatus();
    })
    .Doc(R"doc(
t [K, M] = a [M, K] transposed and rounded to bfloat16 as PackPanelsBf16
rounds (to nearest even, a denormal to zero), in one pass. A weight
gradient's left operand, so that the GEMM reads it plain. unit: who
rounds, as in PanelMatMulBf16 (the same bits either way).
)doc");

class TransposeBf16Op : public OpKernel {
 public:
  explicit TransposeBf16Op(OpKernelConstruction* ctx) : OpKernel(ctx) {
    bool vector = false;
    OP_REQUIRES_OK(ctx, VectorBf16Unit(ctx, "TransposeBf16", &vector));
    round_ = vector ? &bf16_avx512::RoundRow : &ScalarRoundRow;
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& a = ctx->input(0);
    OP_REQUIRES(ctx, a.dims() == 2,
                errors::InvalidArgument("TransposeBf16: a must be a matrix, "
                                        "not of shape ", a.shape().DebugString()));
    const int64_t M = a.dim_size(0), K = a.dim_size(1);
    Tensor* t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({K, M}), &t));
    const float* src = a.flat<float>().data();
    uint16_t* dst = reinterpret_cast<uint16_t*>(t->flat<bfloat16>().data());
    const RoundRowFn round = round_;
    // Tiles of kTile x kTile: each of a's rows rounded into the tile in
    // order (contiguous reads), then the tile written a column at a time
    // (contiguous writes of t's rows); the tile stays in the L1 cache.
    constexpr int64_t kTile = 64;
    const int64_t tiles_k = (K + kTile - 1) / kTile;
    Parallel(ctx, tiles_k, 6 * kTile * M, [&](int64_t t0, int64_t t1) {
      uint16_t tile[kTile][kTile];
      for (int64_t tk = t0; tk < t1; ++tk) {
        const int64_t k0 = tk * kTile, kn = std::min(kTile, K - k0);
        for (int64_t m0 = 0; m0 < M; m0 += kTile) {
          const int64_t mn = std::min(kTile, M - m0);
          for (int64_t i = 0; i < mn; ++i) {
            round(src + (m0 + i) * K + k0, kn, tile[i]);
          }
          for (int64_t j = 0; j < kn; ++j) {
            uint16_t* row = dst + (k0 + j) * M + m0;
            for (int64_t i = 0; i < mn; ++i) row[i] = tile[i][j];
          }
        }
      }
    });
  }

 private:
  RoundRowFn round_;
};

REGISTER_KERNEL_BUILDER(Name("TransposeBf16").Device(DEVICE_CPU),
                        TransposeBf16Op);

REGISTER_OP("PanelMatMulBf16")
    .Input("a: float")
    .Input("panels: int32")
    .Input("addend: float")
    .Attr("unit: {'auto', 'avx512_bf16', 'scalar'} = 'auto'")
    .Output("c: float")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->input(2));
      return OkStatus();
    })
    .Doc(R"doc(
c [M, N] = a [M, K] @ B + addend in bfloat16 with float32 sums: a rounded
to bfloat16 as PackPanelsBf16 rounds B, B given as its panels; each sum of
products as VDPBF16PS makes it, pair after pair of k, then the addend.
unit: avx512_bf16 (VDPBF16PS), scalar (the same arithmetic in scalar code,
on any CPU), or auto (avx512_bf16 where the CPU has it, else scalar).
)doc");

class PanelMatMulBf16Op : public OpKernel {
 public:
  explicit PanelMatMulBf16Op(OpKernelConstruction* ctx) : OpKernel(ctx) {
    bool vector = false;
    OP_REQUIRES_OK(ctx, VectorBf16Unit(ctx, "PanelMatMulBf16", &vector));
    rows_ = vector ? &bf16_avx512::PairRows : &ScalarPairRows;
    round_ = vector ? &bf16_avx512::RoundRow : &ScalarRoundRow;
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& a = ctx->input(0);
    const Tensor& panels = ctx->input(1);
    const Tensor& addend = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckPanelOperands(
                            a, panels, addend,
                            a.dims() == 2 ? NumPairs(a.dim_size(1)) : 0));
    const int64_t M = a.dim_size(0), K = a.dim_size(1), Kp = NumPairs(K);
    const int64_t N = addend.dim_size(1);
    Tensor* c = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({M, N}), &c));
    // a's rows as bfloat16 pairs, once for all the panels.
    Tensor pairs;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(DT_INT32, TensorShape({M, Kp}),
                                           &pairs));
    // A row rounded in order is its pairs; an odd K's last high half is 0.
    const float* ap = a.flat<float>().data();
    uint32_t* apairs = reinterpret_cast<uint32_t*>(pairs.flat<int32>().data());
    uint16_t* halves = reinterpret_cast<uint16_t*>(apairs);
    for (int64_t m = 0; m < M; ++m) {
      round_(ap + m * K, K, halves + m * 2 * Kp);
      if (K % 2) halves[m * 2 * Kp + K] = 0;
    }
    const uint32_t* pp =
        reinterpret_cast<const uint32_t*>(panels.flat<int32>().data());
    const float* xp = addend.flat<float>().data();
    float* cp = c->flat<float>().data();
    const PairRowsFn rows = rows_;
    Parallel(ctx, NumPanels(N), 2 * M * K * kPanel,
             [&](int64_t p0, int64_t p1) {
               for (int64_t p = p0; p < p1; ++p) {
                 const int64_t n0 = p * kPanel;
                 rows(apairs, M, Kp, pp + p * Kp * kPanel, xp + n0, cp + n0,
                      N, N - n0);
               }
             });
  }

 private:
  PairRowsFn rows_;
  RoundRowFn round_;
};

REGISTER_KERNEL_BUILDER(Name("PanelMatMulBf16").Device(DEVICE_CPU),
                        PanelMatMulBf16Op);

REGISTER_OP("SoftmaxCrossEntropy")
    .Input("logits: float")
    .Input("b: float")
    .Input("labels: int32")
    .Attr("isa: {'auto', 'avx512', 'avx2'} = 'auto'")
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
isa: the vector width, avx512 or avx2; auto: $PTB_KERNEL_ISA if set, else
the widest this CPU has.
)doc");

class SoftmaxCrossEntropyOp : public OpKernel {
 public:
  explicit SoftmaxCrossEntropyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    bool wide = false;
    OP_REQUIRES_OK(ctx, ChooseWidth(ctx, "SoftmaxCrossEntropy", &wide));
    row_ = wide ? &avx512::XentRow : &avx2::XentRow;
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
    const XentRowFn row = row_;
    Parallel(ctx, N, 20 * V, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        lossp[n] = row(in + n * V, bp, V, lp(n), out + n * V);
      }
    });
  }

 private:
  XentRowFn row_;
};

REGISTER_KERNEL_BUILDER(Name("SoftmaxCrossEntropy").Device(DEVICE_CPU),
                        SoftmaxCrossEntropyOp);

REGISTER_OP("LstmCell")
    .Input("gates: float")
    .Input("cs_prev: float")
    .Attr("isa: {'auto', 'avx512', 'avx2'} = 'auto'")
    .Output("i: float")
    .Output("cs: float")
    .Output("f: float")
    .Output("o: float")
    .Output("ci: float")
    .Output("co: float")
    .Output("h: float")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      for (int k = 0; k < 7; ++k) c->set_output(k, c->input(1));
      return OkStatus();
    })
    .Doc(R"doc(
The LSTM cell's elementwise part, fused, for gates [B, 4H] (the products
and the bias, blocks i, j, f, o) and cs_prev [B, H]: i = sigmoid(gates_i),
ci = tanh(gates_j), f = sigmoid(gates_f), o = sigmoid(gates_o), cs = ci i +
cs_prev f, co = tanh(cs), h = co o: BlockLSTM's outputs for one step (no
forget bias, no clipping, no peepholes), each [B, H].
isa: the vector width, avx512 or avx2; auto: $PTB_KERNEL_ISA if set, else
the widest this CPU has.
)doc");

class LstmCellOp : public OpKernel {
 public:
  explicit LstmCellOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    bool wide = false;
    OP_REQUIRES_OK(ctx, ChooseWidth(ctx, "LstmCell", &wide));
    row_ = wide ? &avx512::CellRow : &avx2::CellRow;
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& gates = ctx->input(0);
    const Tensor& cs_prev = ctx->input(1);
    OP_REQUIRES(ctx,
                gates.dims() == 2 && cs_prev.dims() == 2 &&
                    gates.dim_size(0) == cs_prev.dim_size(0) &&
                    gates.dim_size(1) == 4 * cs_prev.dim_size(1),
                errors::InvalidArgument(
                    "shapes do not match: gates ", gates.shape().DebugString(),
                    ", cs_prev ", cs_prev.shape().DebugString()));
    const int64_t B = cs_prev.dim_size(0), H = cs_prev.dim_size(1);
    float* outs[7];
    for (int k = 0; k < 7; ++k) {
      Tensor* out = nullptr;
      OP_REQUIRES_OK(ctx, ctx->allocate_output(k, cs_prev.shape(), &out));
      outs[k] = out->flat<float>().data();
    }
    const float* gp = gates.flat<float>().data();
    const float* cp = cs_prev.flat<float>().data();
    const CellRowFn row = row_;
    Parallel(ctx, B, 40 * H, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        float* rows[7];
        for (int k = 0; k < 7; ++k) rows[k] = outs[k] + b * H;
        row(gp + b * 4 * H, cp + b * H, H, rows);
      }
    });
  }

 private:
  CellRowFn row_;
};

REGISTER_KERNEL_BUILDER(Name("LstmCell").Device(DEVICE_CPU), LstmCellOp);

REGISTER_OP("FmaPeak")
    .Input("iterations: int64")
    .Attr("isa: {'auto', 'avx512', 'avx2'} = 'auto'")
    .Output("flops: float64")
    .Output("checksum: float")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
The machine's float32 FMA peak, to time: on every thread of the op's pool,
`iterations` rounds of independent FMA chains of the width's vectors, with
nothing but registers. flops: the floating-point operations done (2 per
lane of an FMA), over all threads; checksum: the chains' sum, so that none
is optimised away. isa as in PanelMatMul.
)doc");

// The peak ops' common part: `iterations` rounds of a chains function on
// every thread of the op's pool, and the FLOPs that makes. A subclass's
// constructor chooses the function and its FLOPs per round.
class PeakOp : public OpKernel {
 public:
  explicit PeakOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const int64_t iterations = ctx->input(0).scalar<int64_t>()();
    OP_REQUIRES(ctx, iterations >= 0,
                errors::InvalidArgument("iterations must be >= 0"));
    const int threads =
        ctx->device()->tensorflow_cpu_worker_threads()->num_threads;
    std::vector<float> sums(threads, 0.0f);
    // One unit per thread, each far too costly to share.
    Parallel(ctx, threads, int64_t{1} << 40, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) sums[t] = chains_(iterations);
    });
    Tensor* flops = nullptr;
    Tensor* checksum = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &flops));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({}), &checksum));
    flops->scalar<double>()() =
        static_cast<double>(iterations) * flops_per_iteration_ * threads;
    float total = 0.0f;
    for (float x : sums) total += x;
    checksum->scalar<float>()() = total;
  }

 protected:
  ChainsFn chains_ = nullptr;
  double flops_per_iteration_ = 0;
};

class FmaPeakOp : public PeakOp {
 public:
  explicit FmaPeakOp(OpKernelConstruction* ctx) : PeakOp(ctx) {
    bool wide = false;
    OP_REQUIRES_OK(ctx, ChooseWidth(ctx, "FmaPeak", &wide));
    chains_ = wide ? &avx512::FmaChains : &avx2::FmaChains;
    flops_per_iteration_ = wide ? avx512::kFlopsPerIteration
                                : avx2::kFlopsPerIteration;
  }
};

REGISTER_KERNEL_BUILDER(Name("FmaPeak").Device(DEVICE_CPU), FmaPeakOp);

REGISTER_OP("Bf16Peak")
    .Input("iterations: int64")
    .Attr("unit: {'auto', 'avx512_bf16', 'amx'} = 'auto'")
    .Output("flops: float64")
    .Output("checksum: float")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
The machine's bfloat16 product peak, to time, as FmaPeak times the
float32 one: on every thread of the op's pool, `iterations` rounds of
independent accumulations of bfloat16 products into float32, in registers
or tiles only. The unit: avx512_bf16, 16 chains of VDPBF16PS (64 FLOPs
each); amx, 4 accumulator tiles of TDPBF16PS on full 16 x 64-byte tiles
(16,384 FLOPs each); auto, amx where the CPU has AMX-BF16, else avx512_bf16
where it has AVX512_BF16. A unit that the CPU lacks is an InvalidArgument
error. The outputs are flops, the floating-point operations done (2 per
product, a multiply and an add) over all threads, and checksum, the
accumulators' sum, so that none is optimised away.
)doc");

class Bf16PeakOp : public PeakOp {
 public:
  explicit Bf16PeakOp(OpKernelConstruction* ctx) : PeakOp(ctx) {
    std::string unit, chosen;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("unit", &unit));
    OP_REQUIRES_OK(ctx, ChooseBf16Unit(unit, CpuBf16Units(), &chosen));
    if (chosen == "amx") {
      OP_REQUIRES_OK(ctx, RequestTileData());
      chains_ = &amx::TileChains;
      flops_per_iteration_ = amx::kFlopsPerIteration;
    } else {
      chains_ = &bf16_avx512::DotChains;
      flops_per_iteration_ = bf16_avx512::kFlopsPerIteration;
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("Bf16Peak").Device(DEVICE_CPU), Bf16PeakOp);

// The tensor of the float32 resource variable at input 0, ready to be
// written in place: its buffer copied first if a read still holds it (as
// TensorFlow's own training ops do). The variable's mutex must be held.
Status WritableVariable(OpKernelContext* ctx, Var* var, Tensor** out) {
  Tensor* t = var->tensor();
  if (t->dtype() != DT_FLOAT) {
    return errors::InvalidArgument("the variable must be float32");
  }
  if (var->copy_on_read_mode.load() || !t->RefCountIsOne()) {
    Tensor copy;
    TF_RETURN_IF_ERROR(ctx->allocate_temp(DT_FLOAT, t->shape(), &copy));
    std::copy_n(t->flat<float>().data(), t->NumElements(),
                copy.flat<float>().data());
    *t = copy;
  }
  *out = t;
  return OkStatus();
}

REGISTER_OP("ApplyOuterProduct")
    .Input("var: resource")
    .Input("x: float")
    .Input("g: float")
    .Input("alpha: float")
    .Attr("isa: {'auto', 'avx512', 'avx2'} = 'auto'")
    .SetShapeFn(shape_inference::NoOutputs)
    .Doc(R"doc(
var += alpha * x^T @ g in place, for x [M, K], g [M, N] and a float32
variable of K * N elements ([K, N], or [N] with K = 1): a gradient that is
one product over M rows, applied without ever being written out. isa as in
PanelMatMul.
)doc");

class ApplyOuterProductOp : public OpKernel {
 public:
  explicit ApplyOuterProductOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    bool wide = false;
    OP_REQUIRES_OK(ctx, ChooseWidth(ctx, "ApplyOuterProduct", &wide));
    block_ = wide ? &avx512::OuterBlock : &avx2::OuterBlock;
    block_rows_ = wide ? avx512::kOuterBlockRows : avx2::kOuterBlockRows;
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(1);
    const Tensor& g = ctx->input(2);
    const Tensor& alpha = ctx->input(3);
    OP_REQUIRES(ctx,
                x.dims() == 2 && g.dims() == 2 &&
                    x.dim_size(0) == g.dim_size(0) &&
                    TensorShapeUtils::IsScalar(alpha.shape()),
                errors::InvalidArgument(
                    "x and g must be [M, K] and [M, N], alpha a scalar: x ",
                    x.shape().DebugString(), ", g ", g.shape().DebugString()));
    const int64_t M = x.dim_size(0), K = x.dim_size(1), N = g.dim_size(1);
    core::RefCountPtr<Var> var;
    OP_REQUIRES_OK(ctx, LookupResource(ctx, HandleFromInput(ctx, 0), &var));
    mutex_lock lock(*var->mu());
    Tensor* w = nullptr;
    OP_REQUIRES_OK(ctx, WritableVariable(ctx, var.get(), &w));
    OP_REQUIRES(ctx, w->NumElements() == K * N,
                errors::InvalidArgument(
                    "the variable ", w->shape().DebugString(),
                    " is not x^T @ g: [", K, ", ", N, "]"));
    const float* xp = x.flat<float>().data();
    const float* gp = g.flat<float>().data();
    float* wp = w->flat<float>().data();
    const float a = alpha.scalar<float>()();
    // Blocks of rows, each swept along its whole rows.
    const int64_t rows = block_rows_;
    const OuterBlockFn block = block_;
    Parallel(ctx, (K + rows - 1) / rows, 2 * M * N * rows,
             [&](int64_t b0, int64_t b1) {
               for (int64_t b = b0; b < b1; ++b) {
                 block(xp, M, K, gp, N, a, wp, b * rows,
                       std::min(K, (b + 1) * rows));
               }
             });
  }

 private:
  OuterBlockFn block_;
  int64_t block_rows_;
};

REGISTER_KERNEL_BUILDER(
    Name("ApplyOuterProduct").Device(DEVICE_CPU).HostMemory("var"),
    ApplyOuterProductOp);

REGISTER_OP("StreamTriad")
    .Input("elements: int64")
    .Input("trials: int64")
    .Attr("isa: {'auto', 'avx512', 'avx2'} = 'auto'")
    .Output("seconds: float64")
    .SetShapeFn([](shape_inference::InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return OkStatus();
    })
    .Doc(R"doc(
The memory bandwidth, to time: STREAM's triad a = b + 3 c over float32
arrays of `elements` each, on every thread of the op's pool, each thread
on its own contiguous part. The arrays are mapped, touched first by the
threads that use them, and unmapped at the end, so that nothing of them
stays in the process. One untimed round, then `trials` timed ones;
seconds: the fastest. By STREAM's count a round moves 12 bytes an element
(leaving out the read of a's lines before they are written). The isa
attribute chooses the width of the loads and stores, as in PanelMatMul.
)doc");

class StreamTriadOp : public OpKernel {
 public:
  explicit StreamTriadOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    bool wide = false;
    OP_REQUIRES_OK(ctx, ChooseWidth(ctx, "StreamTriad", &wide));
    triad_ = wide ? &avx512::Triad : &avx2::Triad;
  }

  void Compute(OpKernelContext* ctx) override {
    const int64_t n = ctx->input(0).scalar<int64_t>()();
    const int64_t trials = ctx->input(1).scalar<int64_t>()();
    OP_REQUIRES(ctx, n > 0 && trials > 0,
                errors::InvalidArgument("elements and trials must be > 0"));
    // The arrays start at different offsets within a page, as STREAM's do:
    // a store to a[i] and loads of b[i], c[i] at the same page offset would
    // falsely depend on each other (4K aliasing).
    constexpr int64_t kSkew = 272;  // floats: 1 KiB and a line
    const size_t bytes = (3 * n + 2 * kSkew) * sizeof(float);
    void* map = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    OP_REQUIRES(ctx, map != MAP_FAILED,
                errors::ResourceExhausted("cannot map ", bytes, " bytes"));
    float* a = static_cast<float*>(map);
    float* b = a + n + kSkew;
    float* c = b + n + kSkew;
    const int threads =
        ctx->device()->tensorflow_cpu_worker_threads()->num_threads;
    const int64_t block = (n + threads - 1) / threads;
    auto each_thread = [&](const std::function<void(int64_t, int64_t)>& f) {
      Parallel(ctx, threads, int64_t{1} << 40, [&](int64_t t0, int64_t t1) {
        for (int64_t t = t0; t < t1; ++t) {
          f(t * block, std::min(n, (t + 1) * block));
        }
      });
    };
    each_thread([&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) a[i] = 0.0f, b[i] = 1.0f, c[i] = 2.0f;
    });
    double best = 0.0;
    for (int64_t round = 0; round <= trials; ++round) {
      const auto start = std::chrono::steady_clock::now();
      each_thread([&](int64_t i0, int64_t i1) {
        triad_(b + i0, c + i0, a + i0, i1 - i0);
      });
      const double took = std::chrono::duration<double>(
          std::chrono::steady_clock::now() - start).count();
      if (round == 1 || (round > 1 && took < best)) best = took;
    }
    // Every element, so that a part no thread wrote (a block's tail, a
    // thread's block) fails the op rather than timing less work.
    const bool right = std::all_of(a, a + n, [](float v) { return v == 7.0f; });
    munmap(map, bytes);
    OP_REQUIRES(ctx, right, errors::Internal("the triad computed wrongly"));
    Tensor* seconds = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &seconds));
    seconds->scalar<double>()() = best;
  }

 private:
  TriadFn triad_;
};

REGISTER_KERNEL_BUILDER(Name("StreamTriad").Device(DEVICE_CPU), StreamTriadOp);

REGISTER_OP("SumAsTf15")
    .Input("x: float")
    .Attr("squares: bool")
    .Attr("threads: int >= 1")
    .Output("sum: float")
    .SetShapeFn(shape_inference::ScalarShape)
    .Doc(R"doc(
The float32 sum that TensorFlow 1.5.1's CPU kernels made of x (all its
values): of x * x * 0.5 with squares (tf.nn.l2_loss), else of x
(tf.reduce_sum over all axes). Its Eigen 3.3 build (AVX) summed in 8 lanes,
each adding its values in order, then paired the lanes (0+4, 1+5, 2+6,
3+7; 0+2, 1+3; 0+1) and added the scalar tail first. From 96,000 values
(108,388 without squares) on a machine of `threads` cores, the values
were split into blocks of floor(n / t) for its cost model's t threads,
the tail block summed first, then each block's sum added in order.
)doc");

namespace {

// One block as Eigen 3.3's InnerMostDimReducer summed it with Packet8f.
float SumBlockAsTf15(const float* x, int64_t n, bool squares) {
  auto value = [&](int64_t i) { return squares ? x[i] * x[i] * 0.5f : x[i]; };
  const int64_t vectorized = n / 8 * 8;
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t j = 0; j < vectorized; j += 8) {
    for (int l = 0; l < 8; ++l) lanes[l] += value(j + l);
  }
  float tail = 0.0f;
  for (int64_t j = vectorized; j < n; ++j) tail += value(j);
  float pairs[4];
  for (int l = 0; l < 4; ++l) pairs[l] = lanes[l] + lanes[l + 4];
  return tail + ((pairs[0] + pairs[2]) + (pairs[1] + pairs[3]));
}

// The threads of Eigen's cost model for this reduction, as TensorFlow
// 1.5.1 chose them (measured on 2 cores: 2 from 96,000 values for
// l2_loss, from 108,388 for reduce_sum; whence costs of 35/16 and 31/16
// cycles a value, the square and the halving 1/8 each).
int64_t ThreadsAsTf15(int64_t n, bool squares, int64_t max_threads) {
  const double cost = squares ? 35.0 / 16.0 : 31.0 / 16.0;
  const double threads = (n * cost - 100000.0) / 100000.0 + 0.9;
  return std::max<int64_t>(1, std::min<int64_t>(max_threads,
                                                static_cast<int64_t>(threads)));
}

}  // namespace

class SumAsTf15Op : public OpKernel {
 public:
  explicit SumAsTf15Op(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("squares", &squares_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("threads", &threads_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& x = ctx->input(0);
    const float* v = x.flat<float>().data();
    const int64_t n = x.NumElements();
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    const int64_t threads = ThreadsAsTf15(n, squares_, threads_);
    float sum;
    if (threads == 1) {
      sum = SumBlockAsTf15(v, n, squares_);
    } else {
      const int64_t block = static_cast<int64_t>(
          std::floor(static_cast<float>(n) / threads));
      const int64_t blocks = block > 0 ? n / block : 0;
      sum = blocks * block < n
                ? SumBlockAsTf15(v + blocks * block, n - blocks * block,
                                 squares_)
                : 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        sum += SumBlockAsTf15(v + b * block, block, squares_);
      }
    }
    out->scalar<float>()() = sum;
  }

 private:
  bool squares_;
  int64_t threads_;
};

REGISTER_KERNEL_BUILDER(Name("SumAsTf15").Device(DEVICE_CPU), SumAsTf15Op);

}  // namespace tensorflow

#else  // PTB_KERNELS_BODY
// The kernels over the vector layer V of the namespace that includes this:
// written once, compiled once per width.

using T = V::T;
using Mask = V::Mask;

constexpr int kW = V::kWidth;
constexpr int kRows = V::kRows;
constexpr int kVectors = kPanel / kW;  // vectors per panel row
static_assert(kPanel % kW == 0, "a panel row is whole vectors");

// A vector at p, or its first lanes (the others zero).
T LoadPart(const float* p, Full) { return V::Load(p); }
T LoadPart(const float* p, Mask m) { return V::LoadMasked(p, m); }
void StorePart(float* p, T v, Full) { V::Store(p, v); }
void StorePart(float* p, T v, Mask m) { V::StoreMasked(p, v, m); }
// max(acc, z) in the lanes of the part, acc in the others.
T MaxPart(T acc, T z, Full) { return V::Max(acc, z); }
T MaxPart(T acc, T z, Mask m) { return V::MaxMasked(acc, z, m); }
// v in the lanes of the part, zero in the others.
T KeepPart(T v, Full) { return v; }
T KeepPart(T v, Mask m) { return V::ZeroOutside(v, m); }

// body(i, part) for the vectors of [0, n): whole ones (part Full), then the
// tail's lanes (part a Mask), unmasked where masks are not free.
template <class F>
void ForVectors(int64_t n, F&& body) {
  int64_t i = 0;
  for (; i + kW <= n; i += kW) body(i, Full());
  if (i < n) body(i, V::FirstLanes(n - i));
}

// c[:R, :32] = a[:R, :] @ panel + x[:R, :32] for one panel [K, 32],
// the columns beyond the matrix masked off by masks (one per vector). At
// each k it also prefetches kLines cache lines from `next` on (see
// PanelTiles).
template <int R, int kLines>
void Tile(const float* a, int64_t lda, const float* panel, int64_t K,
          const float* x, float* c, int64_t ldc, const Mask* masks,
          uintptr_t next) {
  T acc[R][kVectors];
  PTB_TILE_LOOP
  for (int r = 0; r < R; ++r) {
    PTB_TILE_LOOP
    for (int j = 0; j < kVectors; ++j) acc[r][j] = V::Zero();
  }
  for (int64_t k = 0; k < K; ++k) {
    PrefetchPanelRow<kLines>(reinterpret_cast<uintptr_t>(panel), k, next);
    T b[kVectors];
    PTB_TILE_LOOP
    for (int j = 0; j < kVectors; ++j) {
      b[j] = V::Load(panel + kPanel * k + kW * j);
    }
    PTB_TILE_LOOP
    for (int r = 0; r < R; ++r) {
      const T av = V::Set1(a[r * lda + k]);
      PTB_TILE_LOOP
      for (int j = 0; j < kVectors; ++j) {
        acc[r][j] = V::FMAdd(av, b[j], acc[r][j]);
      }
    }
  }
  PTB_TILE_LOOP
  for (int r = 0; r < R; ++r) {
    const float* xr = x + r * ldc;
    float* cr = c + r * ldc;
    PTB_TILE_LOOP
    for (int j = 0; j < kVectors; ++j) {
      const T xj = V::LoadMasked(xr + kW * j, masks[j]);
      V::StoreMasked(cr + kW * j, V::Add(acc[r][j], xj), masks[j]);
    }
  }
}

// The last rows < kRows, as a tile of R rows for R = rows.
template <int R, int kLines>
void TailTile(int64_t rows, const float* a, int64_t K, const float* panel,
              const float* x, float* c, int64_t ldc, const Mask* masks,
              uintptr_t next) {
  if constexpr (R > 0) {
    if (rows == R) {
      Tile<R, kLines>(a, K, panel, K, x, c, ldc, masks, next);
    } else {
      TailTile<R - 1, kLines>(rows, a, K, panel, x, c, ldc, masks, next);
    }
  }
}

// All M rows of a against one panel, in tiles of kRows rows.
//
// The panels stream from L3 or memory. Prefetching only a panel's own rows
// ahead, the first tile's pass waited for memory (its products per row of
// 128 bytes outrun one core's stream) while the second, from L2, did not;
// so the next panel's 2K lines are prefetched too, one line per row and
// pass over the first two passes (both lines with a single pass). Further
// passes (more rows than two tiles) prefetch the next panel again, which is
// then cached: nothing beyond the next panel is fetched. The rows ahead of
// each pass are still prefetched (each shard's first panel, and L2 to L1).
template <int kLines>
void PanelTiles(const float* a, int64_t M, int64_t K, const float* panel,
                const float* x, float* c, int64_t ldc, const Mask* masks,
                uintptr_t next) {
  // Passes that cover the next panel's 2K lines, kLines lines per row.
  constexpr int64_t kCover = 2 / kLines;
  const uintptr_t stride = 64 * kLines * K;
  int64_t m = 0, pass = 0;
  for (; m + kRows <= M; m += kRows, ++pass) {
    Tile<kRows, kLines>(a + m * K, K, panel, K, x + m * ldc, c + m * ldc,
                        ldc, masks, next + stride * (pass % kCover));
  }
  TailTile<kRows - 1, kLines>(M - m, a + m * K, K, panel, x + m * ldc,
                              c + m * ldc, ldc, masks,
                              next + stride * (pass % kCover));
}

// c[:, :width] of one panel (width beyond 32 counts as 32); a PanelRowsFn.
void PanelRows(const float* a, int64_t M, int64_t K, const float* panel,
               const float* x, float* c, int64_t ldc, int64_t width) {
  Mask masks[kVectors];
  for (int j = 0; j < kVectors; ++j) masks[j] = V::FirstLanes(width - kW * j);
  const uintptr_t next =
      reinterpret_cast<uintptr_t>(panel) + sizeof(float) * K * kPanel;
  if (M <= kRows) {
    PanelTiles<2>(a, M, K, panel, x, c, ldc, masks, next);
  } else {
    PanelTiles<1>(a, M, K, panel, x, c, ldc, masks, next);
  }
}


// The update's register tile: kOuterRows rows x kOuterVectors vectors of
// accumulators, with the row's vectors of g and one broadcast of x beside
// them in registers, so that each product of the sum loads one vector a
// row and a broadcast a row (AVX2: 4 x 3 in 16 registers; AVX-512: 6 x 4).
constexpr int kOuterRows = V::kOuterRows;
constexpr int kOuterVectors = V::kOuterVectors;
constexpr int64_t kOuterCols = kOuterVectors * kW;
// Bytes of a tile's row of w, prefetched ahead (whole lines).
constexpr int kOuterLines = (kOuterCols * sizeof(float) + 63) / 64;
// Tiles ahead in its rows that a tile prefetches w's lines: rows of w lie
// far apart, and the hardware prefetchers follow a block's many rows, a
// tile's lines at a time, too late.
constexpr int64_t kOuterAhead = 3;

// w[:R, :cols] += alpha * x[:, :R]^T @ g[:, :cols] for one tile of the
// update: x's columns k.. (stride ldx), g's columns n.. (stride ldg), w's
// rows k.. (stride ldw). The M products of each element are summed in
// registers, and w is read and written once. Part is Full, or the tail's
// lane masks. While it sums, it prefetches the lines of its rows
// kOuterAhead tiles on, one a product.
template <int R, class Part>
void OuterTile(const float* x, int64_t ldx, const float* g, int64_t ldg,
               int64_t M, float* w, int64_t ldw, T alpha, const Part* parts) {
  T acc[R][kOuterVectors];
  PTB_TILE_LOOP
  for (int r = 0; r < R; ++r) {
    PTB_TILE_LOOP
    for (int j = 0; j < kOuterVectors; ++j) acc[r][j] = V::Zero();
  }
  // Addresses, not pointers: the last tiles' point past their rows (into
  // the next rows, or past w), harmlessly.
  const uintptr_t ahead =
      reinterpret_cast<uintptr_t>(w + kOuterAhead * kOuterCols);
  for (int64_t m = 0; m < M; ++m) {
    if (m < R * kOuterLines) {
      const uintptr_t line = ahead + sizeof(float) * ldw * (m / kOuterLines) +
                             64 * (m % kOuterLines);
      _mm_prefetch(reinterpret_cast<const char*>(line), _MM_HINT_T0);
    }
    T b[kOuterVectors];
    PTB_TILE_LOOP
    for (int j = 0; j < kOuterVectors; ++j) {
      b[j] = LoadPart(g + m * ldg + kW * j, parts[j]);
    }
    PTB_TILE_LOOP
    for (int r = 0; r < R; ++r) {
      const T av = V::Set1(x[m * ldx + r]);
      PTB_TILE_LOOP
      for (int j = 0; j < kOuterVectors; ++j) {
        acc[r][j] = V::FMAdd(av, b[j], acc[r][j]);
      }
    }
  }
  PTB_TILE_LOOP
  for (int r = 0; r < R; ++r) {
    float* wr = w + r * ldw;
    PTB_TILE_LOOP
    for (int j = 0; j < kOuterVectors; ++j) {
      const T old = LoadPart(wr + kW * j, parts[j]);
      StorePart(wr + kW * j, V::FMAdd(alpha, acc[r][j], old), parts[j]);
    }
  }
}

// The last rows < kOuterRows of a block, as a tile of R rows for R = rows.
template <int R, class Part>
void OuterTailTile(int64_t rows, const float* x, int64_t ldx, const float* g,
                   int64_t ldg, int64_t M, float* w, int64_t ldw, T alpha,
                   const Part* parts) {
  if constexpr (R > 0) {
    if (rows == R) {
      OuterTile<R>(x, ldx, g, ldg, M, w, ldw, alpha, parts);
    } else {
      OuterTailTile<R - 1>(rows, x, ldx, g, ldg, M, w, ldw, alpha, parts);
    }
  }
}

// Rows [k0, k1) of w against the kOuterCols columns of g from n.
template <class Part>
void OuterColumns(const float* x, int64_t M, int64_t K, const float* g,
                  int64_t N, T alpha, float* w, int64_t k0, int64_t k1,
                  int64_t n, const Part* parts) {
  int64_t k = k0;
  for (; k + kOuterRows <= k1; k += kOuterRows) {
    OuterTile<kOuterRows>(x + k, K, g + n, N, M, w + k * N + n, N, alpha,
                          parts);
  }
  OuterTailTile<kOuterRows - 1>(k1 - k, x + k, K, g + n, N, M, w + k * N + n,
                                N, alpha, parts);
}

// Rows of w per block of the update: a block is swept a tile's columns at a
// time, all its row tiles reading those columns of g ([M, kOuterCols]) from
// L1.
constexpr int64_t kOuterBlockRows = 12 * kOuterRows;

// w[k0:k1, :] += alpha * x[:, k0:k1]^T @ g for x [M, K], g [M, N], w [K, N]
// row-major, k1 - k0 <= kOuterBlockRows; an OuterBlockFn.
void OuterBlock(const float* x, int64_t M, int64_t K, const float* g,
                int64_t N, float alpha, float* w, int64_t k0, int64_t k1) {
  const T a = V::Set1(alpha);
  int64_t n = 0;
  for (; n + kOuterCols <= N; n += kOuterCols) {
    const Full full[kOuterVectors] = {};
    OuterColumns(x, M, K, g, N, a, w, k0, k1, n, full);
  }
  if (n < N) {
    Mask masks[kOuterVectors];
    for (int j = 0; j < kOuterVectors; ++j) {
      masks[j] = V::FirstLanes(N - n - kW * j);
    }
    OuterColumns(x, M, K, g, N, a, w, k0, k1, n, masks);
  }
}

// exp(x) for x <= 88.7: Cephes' expf (2^n e^r with |r| <= ln2 / 2 and a
// degree-7 polynomial for e^r). x under -103.9 counts as -103.9, where exp
// is the smallest denormal float; NaN stays NaN.
T Exp(T x) {
  // max returns its second operand when one is NaN: x, so NaN stays NaN.
  x = V::Max(V::Set1(-103.9f), x);
  const T n = V::Round(V::Mul(x, V::Set1(1.44269504088896341f)));
  T r = V::FNMAdd(n, V::Set1(0.693359375f), x);
  r = V::FNMAdd(n, V::Set1(-2.12194440e-4f), r);
  T y = V::Set1(1.9875691500e-4f);
  y = V::FMAdd(y, r, V::Set1(1.3981999507e-3f));
  y = V::FMAdd(y, r, V::Set1(8.3334519073e-3f));
  y = V::FMAdd(y, r, V::Set1(4.1665795894e-2f));
  y = V::FMAdd(y, r, V::Set1(1.6666665459e-1f));
  y = V::FMAdd(y, r, V::Set1(5.0000001201e-1f));
  y = V::FMAdd(y, V::Mul(r, r), r);
  y = V::Add(y, V::Set1(1.0f));
  return V::Scale2(y, n);
}

// One row of n logits: z = logits + b, written to out; then out =
// softmax(z) - onehot. Returns the loss logsumexp(z) - z[label]; a
// XentRowFn. The row (40 KB for 10,000 words) stays in L1 between the three
// passes. A NaN in z makes the whole row NaN, loss included, as
// TensorFlow's softmax does (the training loop stops on a NaN cost).
float XentRow(const float* logits, const float* b, int64_t n, int64_t label,
              float* out) {
  T mx = V::Set1(-INFINITY);
  V::Flags nan = V::NoFlags();
  ForVectors(n, [&](int64_t i, auto part) {
    const T z = V::Add(LoadPart(logits + i, part), LoadPart(b + i, part));
    StorePart(out + i, z, part);
    mx = MaxPart(mx, z, part);
    nan = V::FlagNan(nan, z);
  });
  const float top = V::Any(nan) ? NAN : V::ReduceMax(mx);
  const float target = out[label];
  const T t = V::Set1(top);
  T sum = V::Zero();
  ForVectors(n, [&](int64_t i, auto part) {
    const T e = KeepPart(Exp(V::Sub(LoadPart(out + i, part), t)), part);
    StorePart(out + i, e, part);
    sum = V::Add(sum, e);
  });
  const float total = V::ReduceAdd(sum);
  const T scale = V::Set1(1.0f / total);
  ForVectors(n, [&](int64_t i, auto part) {
    StorePart(out + i, V::Mul(LoadPart(out + i, part), scale), part);
  });
  out[label] -= 1.0f;
  return std::log(total) + (top - target);
}

// sigmoid(x) = 1 / (1 + exp(-x)), with exp's argument kept below its range's
// end (the result there is 0 to a float's precision); NaN stays NaN (Min
// returns its second operand).
T Sigmoid(T x) {
  const T one = V::Set1(1.0f);
  return V::Div(one, V::Add(one, Exp(V::Min(V::Set1(88.0f), V::Sub(V::Zero(),
                                                                   x)))));
}

// tanh(x) = 1 - 2 / (1 + exp(2x)), exp's argument capped as in Sigmoid.
T Tanh(T x) {
  const T one = V::Set1(1.0f);
  const T e = Exp(V::Min(V::Set1(88.0f), V::Add(x, x)));
  return V::Sub(one, V::Div(V::Set1(2.0f), V::Add(one, e)));
}

// One row of LstmCell: gates [4H] and cs_prev [H] to the seven outputs'
// rows out[0..6] (i, cs, f, o, ci, co, h); a CellRowFn.
void CellRow(const float* gates, const float* cs_prev, int64_t hidden,
             float* const* out) {
  ForVectors(hidden, [&](int64_t k, auto part) {
    const T i = Sigmoid(LoadPart(gates + k, part));
    const T ci = Tanh(LoadPart(gates + hidden + k, part));
    const T f = Sigmoid(LoadPart(gates + 2 * hidden + k, part));
    const T o = Sigmoid(LoadPart(gates + 3 * hidden + k, part));
    const T cs = V::FMAdd(ci, i, V::Mul(LoadPart(cs_prev + k, part), f));
    const T co = Tanh(cs);
    const T values[7] = {i, cs, f, o, ci, co, V::Mul(co, o)};
    for (int n = 0; n < 7; ++n) StorePart(out[n] + k, values[n], part);
  });
}

// a[i] = b[i] + 3 c[i] for i in [0, n): StreamTriad's work on one thread, a
// TriadFn, four vectors an iteration.
void Triad(const float* b, const float* c, float* a, int64_t n) {
  const T three = V::Set1(3.0f);
  int64_t i = 0;
  for (; i + 4 * kW <= n; i += 4 * kW) {
    for (int j = 0; j < 4; ++j) {
      const int64_t at = i + j * kW;
      V::Store(a + at, V::FMAdd(three, V::Load(c + at), V::Load(b + at)));
    }
  }
  for (; i < n; ++i) a[i] = b[i] + 3.0f * c[i];
}

// FmaPeak's work on one thread: `iterations` rounds of V::kChains
// independent chains acc = acc * m + a, in registers; a ChainsFn. Returns
// the chains' sum, which the op reports, so that none can be dropped.
constexpr double kFlopsPerIteration = 2.0 * kW * V::kChains;

float FmaChains(int64_t iterations) {
  T acc[V::kChains];
  for (int i = 0; i < V::kChains; ++i) acc[i] = V::Set1(0.001f * i);
  const T m = V::Set1(0.999999f), a = V::Set1(1e-6f);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < V::kChains; ++i) acc[i] = V::FMAdd(acc[i], m, a);
  }
  T sum = V::Zero();
  for (int i = 0; i < V::kChains; ++i) sum = V::Add(sum, acc[i]);
  return V::ReduceAdd(sum);
}

#endif  // PTB_KERNELS_BODY
