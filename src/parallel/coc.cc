// Chunked GEMM + TP collective pipelines (all-gather then GEMM, GEMM then reduce-scatter / all-reduce).
#include "parallel/coc.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace gale {

namespace {

int64_t row_bytes(const Tensor& t) { return t.size(0) == 0 ? 0 : t.numel() / t.size(0) * dtype_size(t.dtype()); }

// Copies rows [src_row, src_row + n) of src into rows [dst_row, dst_row + n) of dst (same row width).
void copy_rows(const Tensor& src, int64_t src_row, Tensor& dst, int64_t dst_row, int64_t n) {
  const int64_t rb = row_bytes(src);
  GALE_CHECK_EQ(rb, row_bytes(dst));
  if (n == 0) return;
  std::memcpy(static_cast<char*>(dst.raw()) + dst_row * rb, static_cast<const char*>(src.raw()) + src_row * rb,
              static_cast<size_t>(n * rb));
}

void check_chunks(int chunks) { GALE_CHECK(chunks >= 1) << "chunked TP overlap with " << chunks << " chunks"; }

void wait_all(const std::vector<WorkPtr>& works) {
  for (const WorkPtr& w : works) w->wait();
}

}  // namespace

std::vector<std::pair<int64_t, int64_t>> coc_row_chunks(int64_t rows, int chunks) {
  check_chunks(chunks);
  std::vector<std::pair<int64_t, int64_t>> out;
  const int64_t base = rows / chunks, extra = rows % chunks;
  int64_t start = 0;
  for (int i = 0; i < chunks; ++i) {
    const int64_t n = base + (i < extra ? 1 : 0);
    if (n == 0) continue;
    out.emplace_back(start, n);
    start += n;
  }
  return out;
}

Tensor coc_all_gather_rows(const Tensor& x_local, Communicator& tp, int chunks, int64_t N, const CocRowsFn& f,
                           Tensor* x_full, const std::function<void()>& tail) {
  const int n = tp.size();
  const int64_t Tl = x_local.size(0), K = x_local.numel() / std::max<int64_t>(Tl, 1);
  GALE_CHECK(x_local.ndim() == 2) << "chunked all-gather of a " << x_local.shape_string() << " tensor";
  if (x_full) *x_full = Tensor::empty({n * Tl, K}, x_local.dtype());
  Tensor y = Tensor::empty({n * Tl, N});
  const auto parts = coc_row_chunks(Tl, chunks);
  // Every chunk's gather is issued at once: the group runs them in order, so chunk i arrives while
  // the GEMMs of the chunks before it run. Block r of chunk i's buffer is rank r's rows [c, c + m).
  std::vector<Tensor> bufs;
  std::vector<WorkPtr> works;
  for (const auto& [c, m] : parts) {
    bufs.push_back(Tensor::empty({n * m, K}, x_local.dtype()));
    const Tensor send = x_local.slice(c, m);
    works.push_back(tp.all_gather_async(send.raw(), bufs.back().raw(), m * K, x_local.dtype()));
  }
  for (size_t i = 0; i < parts.size(); ++i) {
    const auto [c, m] = parts[i];
    works[i]->wait();
    Tensor out = Tensor::empty({n * m, N});
    f(bufs[i], out);
    for (int r = 0; r < n; ++r) {
      copy_rows(out, r * m, y, r * Tl + c, m);
      if (x_full) copy_rows(bufs[i], r * m, *x_full, r * Tl + c, m);
    }
    bufs[i] = Tensor();
  }
  if (tail) tail();
  return y;
}

Tensor coc_reduce_scatter_rows(const Tensor& x_full, Communicator& tp, int chunks, int64_t N, const CocRowsFn& f,
                               const std::function<void()>& tail) {
  const int n = tp.size();
  GALE_CHECK(x_full.ndim() == 2 && x_full.size(0) % n == 0)
      << "chunked reduce-scatter: first dimension of " << x_full.shape_string() << " is not divisible by the TP size "
      << n;
  const int64_t Tl = x_full.size(0) / n, K = x_full.size(1);
  Tensor y = Tensor::empty({Tl, N});
  // The packed products stay alive until their reduce-scatter completes.
  std::vector<Tensor> sends;
  std::vector<WorkPtr> works;
  for (const auto& [c, m] : coc_row_chunks(Tl, chunks)) {
    Tensor in = Tensor::empty({n * m, K}, x_full.dtype());
    for (int r = 0; r < n; ++r) copy_rows(x_full, r * Tl + c, in, r * m, m);
    sends.push_back(Tensor::empty({n * m, N}));
    f(in, sends.back());
    Tensor recv = y.slice(c, m);
    works.push_back(tp.reduce_scatter_async(sends.back().raw(), recv.raw(), m * N, DType::kF32, ReduceOp::kSum));
  }
  if (tail) tail();
  wait_all(works);
  return y;
}

Tensor coc_all_reduce_rows(const Tensor& x, Communicator& tp, int chunks, int64_t N, const CocRowsFn& f,
                           const std::function<void()>& tail) {
  GALE_CHECK(x.ndim() == 2) << "chunked all-reduce of a " << x.shape_string() << " tensor";
  Tensor y = Tensor::empty({x.size(0), N});
  std::vector<WorkPtr> works;
  for (const auto& [c, m] : coc_row_chunks(x.size(0), chunks)) {
    Tensor out = y.slice(c, m);
    f(x.slice(c, m), out);
    works.push_back(tp.all_reduce_async(out.raw(), m * N, DType::kF32, ReduceOp::kSum));
  }
  if (tail) tail();
  wait_all(works);
  return y;
}

}  // namespace gale
