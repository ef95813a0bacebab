#pragma once
// Conversion between the IR and ONNX protobufs. Only edge code (model_io, checkpoints) includes this.
#include <onnx/onnx_pb.h>

#include "graph/ir.h"

namespace onnxtrain {

// base_dir resolves initializers stored as external data; empty means external data is an error.
Model from_proto(const onnx::ModelProto& p, const std::string& base_dir = {});
Graph graph_from_proto(const onnx::GraphProto& g, const std::string& base_dir = {});
TensorData tensor_from_proto(const onnx::TensorProto& t, const std::string& base_dir = {});

onnx::ModelProto to_proto(const Model& m);
void graph_to_proto(const Graph& g, onnx::GraphProto* out);
void tensor_to_proto(const std::string& name, const TensorData& t, onnx::TensorProto* out);
void type_to_proto(const TypeInfo& t, onnx::TypeProto* out);
void function_to_proto(const Function& f, onnx::FunctionProto* out);

}  // namespace onnxtrain
