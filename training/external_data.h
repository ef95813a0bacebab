#pragma once
// Models over 2 GB: ONNX external data. Protobuf cannot hold a message over 2 GB, so a bigger model keeps its
// large tensors in a side file "<model file name>.<nonce>.data" beside the model (offsets 64-byte aligned). The
// nonce is fresh per save, so the model and the data it refers to are replaced together: the data file is
// written and renamed first, then the model atomically, then older data files are removed. The data file is
// streamed tensor by tensor from where the bytes live (a session's store, through TensorBytes), so a save
// never holds a second copy of the weights or of the optimizer state. docs/checkpoint.md, "Large models".
#include <cstddef>
#include <filesystem>

#include "graph/ir.h"
#include "graph/model_io.h"

namespace onnxtrain {

struct SaveOptions {
  bool force_external_data = false;  // also for models under the limit (tests, or to mmap weights)
  size_t external_min_bytes = 1024;  // smaller tensors stay inline
};

// Above this many tensor bytes a save switches to external data by itself: 2 GB minus 256 MB of headroom for
// nodes, attributes and framing, or the value of the environment variable ONNXTRAIN_EXTERNAL_DATA_BYTES (so
// tests and the CLI can take the large-model path with a small model; a malformed value is an error naming it).
size_t external_data_threshold();

// Atomic like save_model. Tensors of m that are hollow (graph/model_io.h) are read through `bytes` by name;
// without it, m must hold every tensor's bytes. A model with a training step gets the onnxtrain.checksums
// metadata entry (training/checksums.h), computed over the same bytes.
void save_model_large(const Model& m, const std::filesystem::path& path, const SaveOptions& opts = {},
                      const TensorBytes& bytes = {});

}  // namespace onnxtrain
