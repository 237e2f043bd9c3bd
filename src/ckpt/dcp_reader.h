// A reader of PyTorch Distributed Checkpoint directories (torch.distributed.checkpoint's FileSystemWriter).
//
//   GALE_ASSIGN_OR_RETURN(DcpCheckpoint c, DcpCheckpoint::open("ckpt/iter_0000007"));
//   for (const auto& [key, info] : c.tensors()) ... info.shape, info.torch_dtype, info.chunks ...
//   GALE_ASSIGN_OR_RETURN(Tensor w, c.read_tensor("embedding.word_embeddings.weight"));  // the global tensor
//   GALE_ASSIGN_OR_RETURN(PyRef args, c.read_object("args"));                             // a torch.save'd object
//
// The layout (torch 2.x, docs/formats/megatron-checkpoint.md): `<dir>/.metadata` is a pickle of
// torch.distributed.checkpoint.metadata.Metadata (or Megatron core_v0.14+'s subclass MCoreMetadata, whose extra
// mcore_data is not read): `state_dict_metadata` maps each key to a
// TensorStorageMetadata (properties = TensorProperties whose pickled state starts with the dtype,
// size = the global torch.Size, chunks = ChunkStorageMetadata(offsets, sizes) per saved piece) or a
// BytesStorageMetadata; `storage_data` maps MetadataIndex(fqn, offset, index) to
// _StorageInfo(relative_path, offset, length): the byte range of one `__R_I.distcp` file holding that
// piece as a complete torch.save archive (a tensor of the chunk's sizes, or the object). Dataclass
// states may be pickled as a dict or as a (None, slots-dict) pair; both are read.
// Errors name the directory, key and file: a missing or truncated .distcp file, a chunk outside its
// tensor or of another shape or dtype than recorded, chunks that do not cover the tensor, a dtype
// Gale has no type for (float8, complex, ...: named, refused only when that key is read).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/pickle.h"
#include "core/status.h"
#include "core/tensor.h"

namespace gale {

struct DcpChunk {
  Shape offsets, sizes;      // where the piece sits in the global tensor
  std::string file;          // relative to the checkpoint directory ("__0_0.distcp")
  int64_t offset = 0, length = 0;  // its byte range in the file
};

struct DcpTensorInfo {
  std::string torch_dtype;  // "torch.float32", "torch.bfloat16", ...
  bool dtype_known = false;
  DType dtype = DType::kF32;  // when dtype_known
  Shape shape;                // global
  std::vector<DcpChunk> chunks;
};

class DcpCheckpoint {
 public:
  // Parses <dir>/.metadata (the .distcp files are opened when read).
  static StatusOr<DcpCheckpoint> open(const std::string& dir);
  // The same from the bytes of a .metadata file (`dir` is where its .distcp files would be).
  static StatusOr<DcpCheckpoint> from_metadata(std::string_view bytes, const std::string& dir);

  const std::string& directory() const { return dir_; }
  const std::map<std::string, DcpTensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, DcpChunk>& objects() const { return objects_; }  // bytes entries: offsets/sizes empty

  // The global tensor `key`, assembled from its chunks, in the recorded dtype.
  StatusOr<Tensor> read_tensor(const std::string& key) const;
  // The object stored under `key` (a torch.save archive: any value the pickle reader knows).
  StatusOr<PyRef> read_object(const std::string& key) const;

 private:
  StatusOr<std::string> read_range(const DcpChunk& c, const std::string& key) const;
  std::string dir_;
  std::map<std::string, DcpTensorInfo> tensors_;
  std::map<std::string, DcpChunk> objects_;
};

// torch's dtype names ("torch.float32", "torch.bfloat16", ...) -> Gale's; false for the others.
bool dtype_of_torch_name(const std::string& name, DType* out);

}  // namespace gale
