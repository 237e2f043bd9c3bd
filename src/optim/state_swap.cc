// The swap optimizer's anonymous state file, its chunk plan and its staging buffer.
#include "optim/state_swap.h"

#include <algorithm>
#include <chrono>

#include "core/check.h"

namespace gale {

std::vector<int64_t> plan_swap_chunks(const std::vector<StateRun>& runs, int64_t numel, int64_t times, int64_t align) {
  GALE_CHECK(numel >= 0 && align >= 1);
  std::vector<int64_t> bounds = {0};
  if (numel == 0) return bounds;
  const int64_t t = std::max<int64_t>(times, 1);
  for (int64_t j = 1; j < t; ++j) {
    int64_t b = (j * numel + t - 1) / t;  // ⌈j·numel/t⌉
    for (const StateRun& r : runs)
      if (r.begin < b && b < r.begin + r.numel) {
        b = std::min(r.begin + r.numel, r.begin + (b - r.begin + align - 1) / align * align);
        break;
      }
    if (b > bounds.back() && b < numel) bounds.push_back(b);
  }
  bounds.push_back(numel);
  return bounds;
}

StatusOr<std::unique_ptr<OptimizerStateSwap>> OptimizerStateSwap::create(const std::string& dir, int num_states,
                                                                         int64_t numel, std::vector<int64_t> bounds) {
  GALE_CHECK(num_states >= 0 && numel >= 0);
  GALE_CHECK(!bounds.empty() && bounds.front() == 0 && bounds.back() == numel) << "swap chunk plan";
  std::unique_ptr<OptimizerStateSwap> s(new OptimizerStateSwap());
  GALE_ASSIGN_OR_RETURN(s->file_, SwapFile::create(dir, static_cast<int64_t>(num_states) * numel * 4, "--swap-optimizer-dir", "gale-swap-optimizer"));
  s->num_states_ = num_states;
  s->numel_ = numel;
  for (size_t c = 0; c + 1 < bounds.size(); ++c) {
    GALE_CHECK(bounds[c + 1] > bounds[c]) << "swap chunk plan: empty chunk " << c;
    s->max_chunk_ = std::max(s->max_chunk_, bounds[c + 1] - bounds[c]);
  }
  s->bounds_ = std::move(bounds);
  if (num_states > 0 && s->max_chunk_ > 0) s->staging_ = Tensor::empty({num_states * s->max_chunk_});
  return s;
}

std::unique_ptr<OptimizerStateSwap> OptimizerStateSwap::create_compressed(int num_states, int64_t numel,
                                                                       std::vector<int64_t> bounds) {
  GALE_CHECK(num_states >= 0 && numel >= 0);
  GALE_CHECK(!bounds.empty() && bounds.front() == 0 && bounds.back() == numel) << "compress chunk plan";
  std::unique_ptr<OptimizerStateSwap> s(new OptimizerStateSwap());
  s->num_states_ = num_states;
  s->numel_ = numel;
  for (size_t c = 0; c + 1 < bounds.size(); ++c) {
    GALE_CHECK(bounds[c + 1] > bounds[c]) << "compress chunk plan: empty chunk " << c;
    s->max_chunk_ = std::max(s->max_chunk_, bounds[c + 1] - bounds[c]);
  }
  s->bounds_ = std::move(bounds);
  s->blocks_.resize(static_cast<size_t>(num_states * s->num_chunks()));
  if (num_states > 0 && s->max_chunk_ > 0) {
    s->staging_ = Tensor::zeros({num_states * s->max_chunk_});  // the initial state: zeros
    for (int c = 0; c < s->num_chunks(); ++c) {
      s->resident_ = c;
      s->flush();
    }
  }
  return s;
}

int64_t OptimizerStateSwap::compressed_bytes() const {
  int64_t n = 0;
  for (const CompressedPlanes& b : blocks_) n += b.stored_bytes();
  return n;
}

int OptimizerStateSwap::chunk_of(int64_t index) const {
  GALE_CHECK(index >= 0 && index < numel_) << "state element " << index << " of " << numel_;
  return static_cast<int>(std::upper_bound(bounds_.begin(), bounds_.end(), index) - bounds_.begin()) - 1;
}

Status OptimizerStateSwap::transfer(int c, bool to_file) {
  const int64_t begin = bounds_[static_cast<size_t>(c)], n = bounds_[static_cast<size_t>(c) + 1] - begin;
  for (int k = 0; k < num_states_; ++k) {
    float* staged = staging_.data<float>() + static_cast<int64_t>(k) * max_chunk_;
    if (!file_) {  // --compress-optimizer: the blocks of a resident chunk are freed (stale after its update)
      CompressedPlanes& b = block(k, c);
      const auto t0 = std::chrono::steady_clock::now();
      if (to_file) {
        GALE_CHECK(b.empty()) << "--compress-optimizer: chunk " << c << " compressed twice";
        b = compress_planes(staged, n, 4);
      } else {
        decompress_planes(b, staged);
        b = CompressedPlanes();
      }
      (to_file ? encode_seconds_ : decode_seconds_) +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      continue;
    }
    GALE_RETURN_IF_ERROR(to_file ? file_->write(file_offset(k, begin), staged, n * 4)
                                 : file_->read(file_offset(k, begin), staged, n * 4));
  }
  return Status::Ok();
}

void OptimizerStateSwap::load(int c) {
  GALE_CHECK(c >= 0 && c < num_chunks()) << "swap chunk " << c << " of " << num_chunks();
  if (resident_ == c) return;
  flush();
  const Status st = transfer(c, /*to_file=*/false);
  GALE_CHECK(st.ok()) << "--swap-optimizer: " << st.message();
  resident_ = c;
}

void OptimizerStateSwap::flush() {
  if (resident_ < 0) return;
  const Status st = transfer(resident_, /*to_file=*/true);
  GALE_CHECK(st.ok()) << "--swap-optimizer: " << st.message();
  resident_ = -1;
}

Status OptimizerStateSwap::read(int k, int64_t begin, int64_t n, float* out) const {
  GALE_CHECK(resident_ < 0 && k >= 0 && k < num_states_ && begin >= 0 && begin + n <= numel_);
  if (file_) return file_->read(file_offset(k, begin), out, n * 4);
  if (n == 0) return Status::Ok();
  Tensor chunk = Tensor::empty({max_chunk_});
  for (int c = chunk_of(begin); c < num_chunks() && bounds_[static_cast<size_t>(c)] < begin + n; ++c) {
    const int64_t b0 = bounds_[static_cast<size_t>(c)], b1 = bounds_[static_cast<size_t>(c) + 1];
    decompress_planes(block(k, c), chunk.data<float>());
    const int64_t from = std::max(b0, begin), to = std::min(b1, begin + n);
    std::copy(chunk.data<float>() + (from - b0), chunk.data<float>() + (to - b0), out + (from - begin));
  }
  return Status::Ok();
}

Status OptimizerStateSwap::write(int k, int64_t begin, int64_t n, const float* in) {
  GALE_CHECK(resident_ < 0 && k >= 0 && k < num_states_ && begin >= 0 && begin + n <= numel_);
  if (file_) return file_->write(file_offset(k, begin), in, n * 4);
  if (n == 0) return Status::Ok();
  Tensor chunk = Tensor::empty({max_chunk_});
  for (int c = chunk_of(begin); c < num_chunks() && bounds_[static_cast<size_t>(c)] < begin + n; ++c) {
    const int64_t b0 = bounds_[static_cast<size_t>(c)], b1 = bounds_[static_cast<size_t>(c) + 1];
    const int64_t from = std::max(b0, begin), to = std::min(b1, begin + n);
    if (from > b0 || to < b1) decompress_planes(block(k, c), chunk.data<float>());  // a partial chunk
    std::copy(in + (from - begin), in + (to - begin), chunk.data<float>() + (from - b0));
    block(k, c) = CompressedPlanes();
    block(k, c) = compress_planes(chunk.data<float>(), b1 - b0, 4);
  }
  return Status::Ok();
}

}  // namespace gale
