#pragma once
// Checksums of a checkpoint's contents: a CRC-32 (zlib's) of every tensor (its dtype, dims and bytes) in the
// main graph and the training info, and one of the metadata, stored in one metadata entry. A flipped byte in a
// weight's data still parses as a model with a different weight; the checksums turn that into an error that
// names the tensor. Checkpoints written before checksums existed have no entry and load as before.
#include <string>

#include "graph/ir.h"
#include "graph/model_io.h"

namespace onnxtrain {

// The value of metadata entry `key`: the checksums of m's tensors and of its metadata other than `key`, one
// "<crc32 hex> <where>/<name>" line each. Hollow tensors (graph/model_io.h) are read through `bytes`.
std::string checksums_text(const Model& m, const std::string& key, const TensorBytes& bytes = {});

// Throws Error "<source>: ..." naming the first tensor (or the metadata) whose checksum differs, or that is
// missing or extra; does nothing when m has no entry `key`.
void verify_checksums(const Model& m, const std::string& key, const std::string& source);

}  // namespace onnxtrain
