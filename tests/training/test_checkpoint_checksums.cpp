// Checkpoint checksums (training/checksums.h, issue 25): one flipped byte in a weight's data, in an optimizer
// moment, in an external data file or in the metadata is named on load; a checkpoint without checksums (written
// before they existed) still loads; re-saving a loaded checkpoint gives fresh, valid checksums.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>

#include "common/test_env.h"
#include "graph/model_io.h"
#include "training/checkpoint.h"
#include "training/session.h"

namespace onnxtrain {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_bytes(const fs::path& p, const std::string& b) { std::ofstream(p, std::ios::binary) << b; }

// A trained session (Adam: two moments per weight, both non-trivial after two steps).
TrainingSession trained(const fs::path& dir) {
  TrainingConfig cfg;
  cfg.optimizer.kind = "adam";
  TrainingSession s = TrainingSession::from_file(test::make_mlp(dir, "6 16 3"), cfg);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (int step = 0; step < 2; ++step) {
    Tensor x = Tensor::empty(DType::Float32, {8, 6}), y = Tensor::empty(DType::Float32, {8, 3});
    for (float& v : x.span<float>()) v = nd(rng);
    for (float& v : y.span<float>()) v = nd(rng);
    s.train_step({{"x", x}, {s.target_name(), y}});
  }
  return s;
}

// The file with one byte flipped in the middle of `t`'s bytes, which must occur exactly once in it.
std::string flip_inside(const std::string& file, const Tensor& t) {
  const std::string needle(static_cast<const char*>(t.data), t.nbytes());
  const size_t at = file.find(needle);
  EXPECT_NE(at, std::string::npos) << "tensor bytes not found in the file";
  EXPECT_EQ(file.find(needle, at + 1), std::string::npos) << "tensor bytes found twice";
  std::string out = file;
  out[at + needle.size() / 2] = static_cast<char>(out[at + needle.size() / 2] ^ 0x10);
  return out;
}

std::string load_error(const fs::path& p) { return test::error_of([&] { TrainingSession::from_checkpoint(p); }); }

TEST(CheckpointChecksums, AFlippedByteInAWeightOrAnOptimizerMomentIsNamed) {
  auto dir = test::temp_dir("ckpt_checksums");
  TrainingSession s = trained(dir);
  const fs::path ck = dir / "ck.onnx";
  s.save_checkpoint(ck);
  EXPECT_NO_THROW(TrainingSession::from_checkpoint(ck));
  const std::string good = read_bytes(ck);

  const std::string weight = s.trainable().front();
  write_bytes(dir / "bad_weight.onnx", flip_inside(good, s.get_weight(weight)));
  std::string e = load_error(dir / "bad_weight.onnx");
  EXPECT_NE(e.find("bad_weight.onnx"), std::string::npos) << e;
  EXPECT_NE(e.find("tensor '" + weight + "'"), std::string::npos) << e;
  EXPECT_NE(e.find("does not match its checksum"), std::string::npos) << e;

  std::string moment;
  for (const std::string& n : s.state_names())
    if (n.find(weight) != std::string::npos && n != weight && s.state(n).numel() == s.get_weight(weight).numel()) moment = n;
  ASSERT_FALSE(moment.empty()) << "no optimizer moment of " << weight;
  write_bytes(dir / "bad_moment.onnx", flip_inside(good, s.state(moment)));
  e = load_error(dir / "bad_moment.onnx");
  EXPECT_NE(e.find("tensor '" + moment + "'"), std::string::npos) << e;
  EXPECT_NE(e.find("optimizer state"), std::string::npos) << e;
}

TEST(CheckpointChecksums, AFlippedByteInTheExternalDataFileIsNamed) {
  auto dir = test::temp_dir("ckpt_checksums_external");
  TrainingSession s = trained(dir);
  const fs::path ck = dir / "ck.onnx";
  save_model_large(s.checkpoint(), ck, SaveOptions{.force_external_data = true, .external_min_bytes = 64});
  fs::path data;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".data") data = e.path();
  ASSERT_FALSE(data.empty());
  const std::string weight = s.trainable().front();
  write_bytes(data, flip_inside(read_bytes(data), s.get_weight(weight)));
  const std::string e = load_error(ck);
  EXPECT_NE(e.find("tensor '" + weight + "'"), std::string::npos) << e;
}

TEST(CheckpointChecksums, ChangedMetadataIsNamedAndOldCheckpointsStillLoad) {
  auto dir = test::temp_dir("ckpt_checksums_meta");
  TrainingSession s = trained(dir);
  Model m = s.checkpoint();
  const fs::path ck = dir / "ck.onnx";
  save_model_large(m, ck);
  Model loaded = load_model(ck);
  bool has = false;
  for (auto& [k, v] : loaded.metadata) has |= k == std::string(kCheckpointKeyPrefix) + "checksums";
  ASSERT_TRUE(has) << "no checksum entry in the saved checkpoint";

  Model edited = loaded;
  edited.metadata.emplace_back("onnxtrain.added_later", "1");
  const std::string e = test::error_of([&] { TrainingSession::from_checkpoint(edited, "edited.onnx"); });
  EXPECT_NE(e.find("edited.onnx"), std::string::npos) << e;
  EXPECT_NE(e.find("the metadata"), std::string::npos) << e;

  // Written before checksums existed: no entry, nothing to verify.
  Model old = loaded;
  std::erase_if(old.metadata, [](const auto& kv) { return kv.first == std::string(kCheckpointKeyPrefix) + "checksums"; });
  EXPECT_NO_THROW(TrainingSession::from_checkpoint(old, "old.onnx"));

  // A loaded checkpoint saved again (its old entry replaced) verifies.
  save_model_large(loaded, dir / "again.onnx");
  EXPECT_NO_THROW(TrainingSession::from_checkpoint(dir / "again.onnx"));
}

}  // namespace
}  // namespace onnxtrain
