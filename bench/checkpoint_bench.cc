// Checkpoint save/load throughput against plain file I/O of the same bytes (the baselines).
//
//   build/bench/checkpoint_bench [--benchmark_filter=...]   (writes under $TMPDIR, ~2x the size)
// Each case moves `MiB` mebibytes of f32 tensors in 64 equal tensors (a model-like mix of names).
// Baselines: RawWriteFsync = write() + fsync + rename of one file of the same size; RawRead =
// read() of that file from the page cache. Checkpoint cases include everything the real path
// does: safetensors header, CRC-32 while writing, fsyncs, metadata.json, rename, tracker; and on
// load: tracker, metadata and header validation, CRC-32 verification (or not), conversion copy.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/checkpoint_layout.h"
#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"

namespace gale {
namespace {

namespace fs = std::filesystem;
constexpr int kTensors = 64;

}  // namespace

std::string bench_dir() {
  static std::string dir = [] {
    std::string p = (fs::temp_directory_path() / "gale_ckpt_bench_XXXXXX").string();
    GALE_CHECK(::mkdtemp(p.data()) != nullptr);
    return p;
  }();
  return dir;
}

namespace {

std::vector<Tensor> make_tensors(int64_t mib) {
  const int64_t per = mib * (1 << 20) / 4 / kTensors;
  std::vector<Tensor> ts;
  for (int i = 0; i < kTensors; ++i) {
    Tensor t = Tensor::empty({per});
    for (int64_t k = 0; k < per; ++k) t.data<float>()[k] = static_cast<float>(k % 977) * 0.001f + static_cast<float>(i);
    ts.push_back(t);
  }
  return ts;
}

std::string name_of(int i) { return "decoder.layers." + std::to_string(i) + ".mlp.linear_fc1.weight"; }

void BM_RawWriteFsync(benchmark::State& state) {
  std::vector<Tensor> ts = make_tensors(state.range(0));
  std::string path = bench_dir() + "/raw.bin";
  for (auto _ : state) {
    int fd = ::open((path + ".tmp").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (const Tensor& t : ts) GALE_CHECK_EQ(::write(fd, t.raw(), t.nbytes()), static_cast<ssize_t>(t.nbytes()));
    ::fsync(fd);
    ::close(fd);
    ::rename((path + ".tmp").c_str(), path.c_str());
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * (1 << 20));
}

void BM_CheckpointSave(benchmark::State& state) {
  std::vector<Tensor> ts = make_tensors(state.range(0));
  Comm self = make_self_communicator();
  int64_t it = 0;
  for (auto _ : state) {
    CheckpointWriter w(bench_dir() + "/ckpt", ++it, *self);
    for (int i = 0; i < kTensors; ++i) GALE_CHECK_OK(w.add(name_of(i), ts[static_cast<size_t>(i)]));
    GALE_CHECK_OK(w.commit(nlohmann::json{{"args", {{"lr", 1e-4}}}}));
    state.PauseTiming();
    fs::remove_all(iteration_dir(bench_dir() + "/ckpt", it));
    state.ResumeTiming();
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * (1 << 20));
}

void BM_RawRead(benchmark::State& state) {
  std::string path = bench_dir() + "/raw.bin";
  if (!fs::exists(path)) {
    state.SkipWithError("run BM_RawWriteFsync first");
    return;
  }
  Tensor buf = Tensor::empty({static_cast<int64_t>(fs::file_size(path) / 4)});
  for (auto _ : state) {
    int fd = ::open(path.c_str(), O_RDONLY);
    size_t done = 0;
    while (done < buf.nbytes())
      done += static_cast<size_t>(::read(fd, static_cast<char*>(buf.raw()) + done, buf.nbytes() - done));
    ::close(fd);
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(buf.nbytes()));
}

void BM_CheckpointLoad(benchmark::State& state) {
  const bool crc = state.range(1) != 0;
  std::vector<Tensor> ts = make_tensors(state.range(0));
  Comm self = make_self_communicator();
  std::string dir = bench_dir() + "/load";
  CheckpointWriter w(dir, 1, *self);
  for (int i = 0; i < kTensors; ++i) GALE_CHECK_OK(w.add(name_of(i), ts[static_cast<size_t>(i)]));
  GALE_CHECK_OK(w.commit(nlohmann::json::object()));
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(Tensor::empty(t.shape()));
  for (auto _ : state) {
    CheckpointReaderOptions options;
    options.verify_checksums = crc;
    StatusOr<CheckpointReader> r = CheckpointReader::open(dir, options);
    GALE_CHECK_OK(r.status());
    for (int i = 0; i < kTensors; ++i)
      GALE_CHECK_OK(
          r->read_slice_into(name_of(i), ts[static_cast<size_t>(i)].shape(), {0}, out[static_cast<size_t>(i)]));
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * (1 << 20));
}

BENCHMARK(BM_RawWriteFsync)->Arg(256)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
BENCHMARK(BM_CheckpointSave)->Arg(256)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
BENCHMARK(BM_RawRead)->Arg(256)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(5);
BENCHMARK(BM_CheckpointLoad)
    ->Args({256, 1})
    ->Args({256, 0})
    ->ArgNames({"MiB", "crc"})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(5);

}  // namespace
}  // namespace gale

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::error_code ec;
  std::filesystem::remove_all(gale::bench_dir(), ec);
  return 0;
}
