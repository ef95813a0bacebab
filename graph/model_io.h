#pragma once
// The protobuf edge: load (with validation), save, and conversion to and from onnx::ModelProto.
#include <cstddef>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "graph/ir.h"

namespace onnxtrain {

struct LoadOptions {
  bool validate = true;      // ONNX checker, then our own checks (validate.h)
  bool infer_shapes = true;  // fill Graph::value_info (shape_inference.h)
};

// Errors name the file (or the source name given for bytes) and the node at fault.
Model load_model(const std::filesystem::path& path, const LoadOptions& opts = {});
Model load_model_from_bytes(std::string_view bytes, const std::string& source = "<bytes>",
                            const LoadOptions& opts = {});

std::string serialize_model(const Model& m);
// Writes atomically (temp file in the same folder, fsync, rename) so a crash never leaves a torn file.
void save_model(const Model& m, const std::filesystem::path& path);
// The atomic write itself: temp file beside the target, write, fsync, rename, fsync the folder. Errors name
// the path. Once the new file is in place, temp files that earlier, killed saves of the same path left behind
// (older than the new file) are removed.
void write_file_atomically(const std::string& bytes, const std::filesystem::path& path);
// The same, for a file too large to build in memory first: `produce` hands the bytes, `total` of them, to
// `write` in pieces (a checkpoint's external data file is written tensor by tensor from where they live).
using WriteBytes = std::function<void(const void* data, size_t n)>;
void write_file_atomically(size_t total, const std::function<void(const WriteBytes& write)>& produce,
                           const std::filesystem::path& path);

// A tensor whose bytes live elsewhere (in a training session's store): dtype and dims set, no bytes. Large
// models keep one copy of each weight; graphs and models that describe them hold hollow tensors, and writers
// look the bytes up by the tensor's name through a TensorBytes.
bool is_hollow(const TensorData& t);
using TensorBytes = std::function<std::span<const std::byte>(const std::string& name)>;

}  // namespace onnxtrain
