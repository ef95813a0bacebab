// The data-parallel wiring without MPI: communicator argument checks, bucketing, the AllReduce kernel, and a
// TrainingSession driven by a two-rank "mirror" communicator whose peer always holds the same values. With a
// mean, the mirror's reductions are exact, so such a session must train bit for bit like a single process and
// write the same checkpoint.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "common/test_env.h"
#include "distributed/allreduce.h"
#include "training/data_parallel.h"
#include "distributed/mpi.h"
#include "dp_common.h"
#include "graph/error.h"
#include "training/checkpoint.h"

namespace onnxtrain {
namespace {

class Mirror final : public Communicator {
 public:
  explicit Mirror(int rank = 0) : rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  Device device() const override { return Device::CPU; }
  std::string backend() const override { return "mirror"; }
  int allreduces = 0, broadcasts = 0;
  size_t reduced_values = 0;
  bool corrupt_broadcast = false;  // pretend the peer holds something else

 protected:
  void do_broadcast(void* data, size_t bytes, int) override {
    ++broadcasts;
    if (corrupt_broadcast) static_cast<unsigned char*>(data)[0] ^= 1;
  }
  void do_allreduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    ++allreduces;
    reduced_values += count;
    if (send != recv) std::memcpy(recv, send, count * dtype_size(dtype));
    if (op == ReduceOp::Sum) {
      if (dtype == DType::Float32) for (size_t i = 0; i < count; ++i) static_cast<float*>(recv)[i] *= 2;
      else for (size_t i = 0; i < count; ++i) static_cast<double*>(recv)[i] *= 2;
    }
  }
  void do_barrier() override {}

 private:
  int rank_;
};

std::filesystem::path make_mlp(const std::string& name, const std::string& sizes) {
  auto dir = test::temp_dir(name);
  auto path = dir / "mlp.onnx";
  std::string cmd = test::python() + " " + (test::source_dir() / "examples/make_mlp.py").string() + " " +
                    path.string() + " --sizes " + sizes + " > /dev/null";
  if (std::system(cmd.c_str()) != 0) throw Error("make_mlp.py failed");
  return path;
}

// Buckets: blocking AllReduce nodes, or AllReduceStart nodes (each with its AllReduceWait).
size_t count_allreduce(const Graph& g) {
  return std::count_if(g.nodes.begin(), g.nodes.end(),
                       [](const Node& n) { return n.op_type == kAllReduceOp || n.op_type == kAllReduceStartOp; });
}

TEST(Communicator, SingleProcess) {
  auto c = single_process_communicator();
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(c->size(), 1);
  float a[2] = {1, 2}, b[2] = {0, 0};
  c->allreduce(a, b, 2, DType::Float32, ReduceOp::Mean);
  EXPECT_EQ(b[1], 2);
  EXPECT_EQ(c->allreduce(3.5, ReduceOp::Sum), 3.5);
  c->barrier();
  int64_t i = 0;
  try {
    c->allreduce(&i, 1, DType::Int64, ReduceOp::Sum);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "single rank 0 of 1: allreduce: expected float32, float64, float16 or bfloat16 values, got int64");
  }
  EXPECT_THROW(c->broadcast(&i, sizeof i, 1), Error);
  EXPECT_FALSE(c->broken()) << "argument errors leave it usable";
}

TEST(Communicator, TimeoutSetting) {
  EXPECT_EQ(comm_timeout(2.5), 2.5);
  EXPECT_THROW(comm_timeout(-1), Error);
  setenv("ONNXTRAIN_COMM_TIMEOUT", "7", 1);
  EXPECT_EQ(comm_timeout(), 7);
  setenv("ONNXTRAIN_COMM_TIMEOUT", "soon", 1);
  EXPECT_THROW(comm_timeout(), Error);
  unsetenv("ONNXTRAIN_COMM_TIMEOUT");
  EXPECT_EQ(comm_timeout(), 300);
}

TEST(Communicator, OutsideMpirunTheEnvironmentMeansOneProcess) {
  if (launched_by_mpi()) GTEST_SKIP() << "this test binary runs under an MPI launcher";
  EXPECT_EQ(communicator_from_environment()->backend(), "single");
}

TEST(AllReduceGraph, BucketsByDtypeAndSize) {
  Graph g;
  std::vector<ReducedValue> v = {{"a", DType::Float32, 400}, {"d", DType::Float64, 8}, {"b", DType::Float32, 400},
                                 {"c", DType::Float32, 400}, {"huge", DType::Float32, 5000}};
  for (const auto& x : v) g.inputs.push_back({x.name, TypeInfo{x.dtype, Shape{}}});
  auto reduced = insert_allreduce(g, v, ReduceOp::Mean, 1000);
  ASSERT_EQ(g.nodes.size(), 4u);  // [a b] [c] [huge] for float32, [d] for float64
  EXPECT_EQ(g.nodes[0].inputs, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(g.nodes[1].inputs, (std::vector<std::string>{"c"}));
  EXPECT_EQ(g.nodes[2].inputs, (std::vector<std::string>{"huge"}));
  EXPECT_EQ(g.nodes[3].inputs, (std::vector<std::string>{"d"}));
  EXPECT_EQ(g.nodes[0].attr_string("reduction", ""), "mean");
  EXPECT_EQ(g.nodes[0].outputs[1], reduced.at("b"));
  EXPECT_EQ(g.type_of(reduced.at("d"))->dtype, DType::Float64);
  EXPECT_THROW(insert_allreduce(g, {{"i", DType::Int64, 8}}, ReduceOp::Sum, 1000), Error);
  EXPECT_THROW(insert_allreduce(g, {{"a", DType::Float32, 4}}, ReduceOp::Sum, 0), Error);
}

TEST(AllReduceGraph, KernelPacksAndUnpacks) {
  auto mirror = std::make_shared<Mirror>();
  KernelRegistry reg = default_kernels();
  register_allreduce_kernel(reg, mirror);
  Graph g;
  g.inputs = {{"p", TypeInfo{DType::Float32, Shape{Dim::of(2), Dim::of(3)}}}, {"q", TypeInfo{DType::Float32, Shape{Dim::of(4)}}}};
  auto reduced = insert_allreduce(g, {{"p", DType::Float32, 24}, {"q", DType::Float32, 16}}, ReduceOp::Sum, 1 << 20);
  g.outputs = {{reduced.at("p"), {}}, {reduced.at("q"), {}}};
  ExecutorOptions eo;
  eo.registry = &reg;
  Executor ex(g, {{"", 17}, {"onnxtrain", 1}}, std::make_shared<TensorStore>(), eo);
  auto out = ex.run({{"p", Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6})},
                     {"q", Tensor::from_vector<float>({4}, {-1, -2, -3, -4})}});
  EXPECT_EQ(mirror->allreduces, 1) << "one message per bucket";
  EXPECT_EQ(std::vector<float>(out[0].span<float>().begin(), out[0].span<float>().end()),
            (std::vector<float>{2, 4, 6, 8, 10, 12}));
  EXPECT_EQ(std::vector<float>(out[1].span<float>().begin(), out[1].span<float>().end()),
            (std::vector<float>{-2, -4, -6, -8}));
}

TEST(AllReduceGraph, RemoveRestoresTheSingleProcessGraph) {
  Graph g;
  g.inputs = {{"w_grad", TypeInfo{DType::Float32, Shape{}}}};
  auto reduced = insert_allreduce(g, {{"w_grad", DType::Float32, 4}}, ReduceOp::Mean, 64);
  g.nodes.push_back(Node{"use", "Neg", "", {reduced.at("w_grad")}, {"out"}, {}, {}});
  g.outputs = {{reduced.at("w_grad"), {}}, {"out", {}}};
  remove_allreduce(g);
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.nodes[0].inputs[0], "w_grad");
  EXPECT_EQ(g.outputs[0].name, "w_grad");
  EXPECT_FALSE(g.value_info.count(reduced.at("w_grad")));
}

// Overlap: the start right after the node producing the bucket's last gradient, the waits after every node that
// needs no reduction, the earliest-started first; buckets fill in the order the gradients are produced.
TEST(AllReduceGraph, StartsAsEarlyAndWaitsAsLateAsTheDependenciesAllow) {
  Graph g;
  g.inputs = {{"x", TypeInfo{DType::Float32, Shape{Dim::of(1)}}}};
  g.nodes = {Node{"n0", "Neg", "", {"x"}, {"g1"}, {}, {}}, Node{"n1", "Neg", "", {"g1"}, {"h"}, {}, {}},
             Node{"n2", "Neg", "", {"h"}, {"g2"}, {}, {}}, Node{"n3", "Neg", "", {"g2"}, {"k"}, {}, {}}};
  BucketOptions o;
  o.bucket_bytes = 4;  // one value per bucket
  o.overlap = true;
  // Listed in layer order (g2 is the "first layer's"), so the buckets must be reordered: g1 is produced first.
  auto reduced = insert_allreduce(g, {{"g2", DType::Float32, 4}, {"g1", DType::Float32, 4}}, ReduceOp::Mean, o);
  g.nodes.push_back(Node{"use2", "Neg", "", {reduced.at("g2")}, {"u2"}, {}, {}});
  g.nodes.push_back(Node{"use1", "Neg", "", {reduced.at("g1")}, {"u1"}, {}, {}});
  g.outputs = {{"u1", {}}, {"u2", {}}, {"k", {}}};
  place_collectives(g);
  std::vector<std::string> order;
  for (const Node& n : g.nodes)
    order.push_back(n.op_type == "Neg" ? n.name : n.op_type + "(" + n.inputs.back() + ")");
  // The waits after everything that needs no reduction, in start order, each followed by what it enables.
  EXPECT_EQ(order, (std::vector<std::string>{"n0", "AllReduceStart(g1)", "n1", "n2", "AllReduceStart(g2)", "n3",
                                             "AllReduceWait(g1)", "use1", "AllReduceWait(g2)", "use2"}));
  // And the single-process graph comes back without them.
  remove_allreduce(g);
  ASSERT_EQ(g.nodes.size(), 6u);
  EXPECT_EQ(g.nodes[4].inputs[0], "g1");
  EXPECT_EQ(g.nodes[5].inputs[0], "g2");
}

TEST(AllReduceGraph, StartAndWaitKernelsPackAndUnpack) {
  auto mirror = std::make_shared<Mirror>();
  KernelRegistry reg = default_kernels();
  register_allreduce_kernel(reg, mirror);
  Graph g;
  g.inputs = {{"p", TypeInfo{DType::Float32, Shape{Dim::of(2), Dim::of(3)}}}, {"q", TypeInfo{DType::Float32, Shape{Dim::of(4)}}}};
  BucketOptions o;
  o.overlap = true;
  auto reduced = insert_allreduce(g, {{"p", DType::Float32, 24}, {"q", DType::Float32, 16}}, ReduceOp::Sum, o);
  g.outputs = {{reduced.at("p"), {}}, {reduced.at("q"), {}}};
  place_collectives(g);
  ExecutorOptions eo;
  eo.registry = &reg;
  Executor ex(g, {{"", 17}, {"onnxtrain", 1}}, std::make_shared<TensorStore>(), eo);
  for (int run = 0; run < 2; ++run) {
    auto out = ex.run({{"p", Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6})},
                       {"q", Tensor::from_vector<float>({4}, {-1, -2, -3, -4})}});
    EXPECT_EQ(std::vector<float>(out[0].span<float>().begin(), out[0].span<float>().end()),
              (std::vector<float>{2, 4, 6, 8, 10, 12}));
    EXPECT_EQ(std::vector<float>(out[1].span<float>().begin(), out[1].span<float>().end()),
              (std::vector<float>{-2, -4, -6, -8}));
  }
  EXPECT_EQ(mirror->allreduces, 2) << "one message per bucket and run";
  EXPECT_THROW(insert_allreduce(g, {{"p", DType::Float32, 24}}, ReduceOp::Sum, BucketOptions{64, true, "int8"}), Error);
}

class MirrorEquivalence : public ::testing::TestWithParam<std::tuple<const char*, const char*>> {};

// With and without overlap (test::kDpModes), for each optimizer configuration.
TEST_P(MirrorEquivalence, TrainsLikeOneProcess) {
  const std::string config = std::get<0>(GetParam()), mode = std::get<1>(GetParam());
  const auto path = make_mlp("dp_mirror_" + config + "_" + mode, "16 32 8 1");
  const test::Dataset data = test::make_dataset(256, 16, 1);
  TrainingConfig plain_cfg = test::dp_config(config);
  TrainingSession plain = TrainingSession::from_file(path, plain_cfg);
  auto mirror = std::make_shared<Mirror>();
  TrainingConfig cfg = test::dp_config(config);
  cfg.parallel.communicator = mirror;
  cfg.parallel.bucket_bytes = 1024;
  test::set_dp_mode(cfg.parallel, mode);
  TrainingSession dp = TrainingSession::from_file(path, cfg);
  EXPECT_EQ(count_allreduce(plain.training_graph()), 0u);
  const Graph& tg = dp.training_graph();
  EXPECT_EQ(std::count_if(tg.nodes.begin(), tg.nodes.end(), [](const Node& n) { return n.op_type == kAllReduceOp; }) == 0,
            mode == "overlap");
  // 1 KB buckets: fc1.weight (2 KB) alone, the smaller tensors and the loss packed together.
  const size_t expected_buckets = count_allreduce(dp.training_graph());
  EXPECT_GE(expected_buckets, 3u);
  EXPECT_LT(expected_buckets, dp.trainable().size() + 1);
  EXPECT_EQ(mirror->broadcasts, int(1 + dp.trainable().size() + dp.state_names().size()))
      << "the fingerprint, then every weight and state tensor from rank 0";
  const auto a = test::train_shard(plain, data, 0, 1, 6, 8);
  const int before = mirror->allreduces;
  const auto b = test::train_shard(dp, data, 0, 1, 6, 8);
  EXPECT_EQ(a, b);
  EXPECT_EQ(mirror->allreduces - before, 6 * int(expected_buckets));
  for (const auto& [name, w] : plain.weights())
    EXPECT_EQ(0, std::memcmp(w.data, dp.get_weight(name).data, w.nbytes())) << name;
  // The checkpoint holds the single-process step: the same algorithm graph as the plain session's.
  const Model ca = plain.checkpoint(), cb = dp.checkpoint();
  const Graph& ga = ca.training_info.at(0).algorithm;
  const Graph& gb = cb.training_info.at(0).algorithm;
  // The same nodes; with overlap in another topological order (place_collectives moves the optimizer's updates
  // of early-reduced weights ahead), so compared by what each computes.
  ASSERT_EQ(ga.nodes.size(), gb.nodes.size());
  auto computed = [](const Graph& g) {
    std::vector<std::pair<std::vector<std::string>, std::pair<std::string, std::vector<std::string>>>> v;
    for (const Node& n : g.nodes) v.push_back({n.outputs, {n.op_type, n.inputs}});
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(computed(ga), computed(gb));
  EXPECT_EQ(ga.outputs.front().name, gb.outputs.front().name);
  EXPECT_EQ(ca.training_info[0].update_binding, cb.training_info[0].update_binding);
}

INSTANTIATE_TEST_SUITE_P(DataParallelSession, MirrorEquivalence,
                         ::testing::Combine(::testing::Values("sgd_momentum", "adam", "sgd_accumulate"),
                                            ::testing::ValuesIn(test::kDpModes)),
                         [](const auto& i) {
                           return std::string(std::get<0>(i.param)) + "_" + std::get<1>(i.param);
                         });

TEST(DataParallelSession, MismatchedRanksFailAtConstruction) {
  const auto path = make_mlp("dp_mismatch", "16 8 1");
  auto mirror = std::make_shared<Mirror>();
  mirror->corrupt_broadcast = true;
  TrainingConfig cfg = test::dp_config("adam");
  cfg.parallel.communicator = mirror;
  try {
    TrainingSession::from_file(path, cfg);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("differ from rank 0 in the model, trainable weights or training configuration"),
              std::string::npos)
        << e.what();
  }
}

TEST(DataParallelSession, SummedLossWithPenaltyIsRefused) {
  const auto path = make_mlp("dp_sum_penalty", "16 8 1");
  TrainingConfig cfg = test::dp_config("adam_sum");
  cfg.penalty.l2 = 0.1;
  cfg.parallel.communicator = std::make_shared<Mirror>();
  EXPECT_THROW(TrainingSession::from_file(path, cfg), Error);
  cfg.parallel.communicator = single_process_communicator();  // one rank: nothing to refuse
  EXPECT_NO_THROW(TrainingSession::from_file(path, cfg));
}

TEST(DataParallelSession, OnlyRankZeroWritesFiles) {
  const auto path = make_mlp("dp_writes", "16 8 1");
  TrainingConfig cfg = test::dp_config("adam");
  cfg.parallel.communicator = std::make_shared<Mirror>(1);  // rank 1 of 2
  TrainingSession s = TrainingSession::from_file(path, cfg);
  const auto dir = path.parent_path();
  s.save_checkpoint(dir / "ckpt.onnx");
  s.export_inference(dir / "model.onnx");
  EXPECT_FALSE(std::filesystem::exists(dir / "ckpt.onnx"));
  EXPECT_FALSE(std::filesystem::exists(dir / "model.onnx"));
  EXPECT_FALSE(s.checkpoint().training_info.empty()) << "checkpoint() itself still works on every rank";
}

}  // namespace
}  // namespace onnxtrain
