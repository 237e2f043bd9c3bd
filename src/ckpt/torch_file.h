// Files torch.save writes (a zip archive: <stem>/data.pkl, <stem>/data/<key> per storage, <stem>/version): reading and writing.
//
//   GALE_ASSIGN_OR_RETURN(PyRef root, read_torch_file("iter_0000007/mp_rank_00/model_optim_rng.pt"));
//   const PyValue* model = root->get("model");     // a dict of name -> kTensor, each with .data filled
//   GALE_RETURN_IF_ERROR(write_torch_file("out/model_optim_rng.pt", *root));
//
// Reading resolves every tensor's storage: `data` holds a contiguous copy in the storage's dtype
// (FloatStorage f32, BFloat16Storage bf16, HalfStorage f16, DoubleStorage f64, LongStorage i64,
// IntStorage i32, ByteStorage/BoolStorage u8, UInt16Storage u16). A storage entry shorter than its element count, a
// tensor reaching past its storage or a non-contiguous one is an error naming the file and tensor.
// The legacy (pre-1.6, non-zip) torch.save format is refused with a clear message.
// Writing lays the archive out as torch's PyTorchStreamWriter does (data.pkl, byteorder "little",
// data/<k>, version "3"), every entry stored and 64-byte aligned, so torch.load reads it.
#pragma once

#include <string>

#include "ckpt/pickle.h"
#include "core/status.h"

namespace gale {

StatusOr<PyRef> read_torch_file(const std::string& path);
// The same from bytes already in memory (`path` names them in messages).
StatusOr<PyRef> read_torch_bytes(std::string bytes, const std::string& path);

// `root`'s kTensor values are written from their `data` (contiguous).
Status write_torch_file(const std::string& path, const PyValue& root);
// The same archive's bytes, its entries under `stem`/ (torch.save into a buffer uses "archive").
StatusOr<std::string> write_torch_bytes(const PyValue& root, const std::string& stem);

}  // namespace gale
