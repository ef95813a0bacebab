// Whole runs of the onnxtrain binary: the digits and cnn examples, resume and Ctrl-C continuing bit for bit, CSV data
// (with train.profile's step table), export, info and exit codes.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "common/test_env.h"

namespace onnxtrain {
namespace {

struct CliRun {
  int code = -1;
  std::string out;
};

CliRun run(const std::string& args) {
  std::string cmd = std::string(ONNXTRAIN_CLI) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  CliRun r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// examples/<folder> in a temp folder: the data its make_<folder>.py generates + the example's config.
std::filesystem::path example(const std::string& folder, const std::string& name) {
  auto dir = test::temp_dir(name);
  const auto src = test::source_dir() / "examples" / folder;
  std::string cmd = test::python() + " " + (src / ("make_" + folder + ".py")).string() + " " +
                    (dir / "data").string() + " > /dev/null";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
  std::filesystem::copy_file(src / "config.yaml", dir / "config.yaml");
  return dir;
}

std::filesystem::path digits(const std::string& name) { return example("digits", name); }

double metric(const std::string& out, const std::string& name) {
  const size_t at = out.find(name);
  if (at == std::string::npos) return -1;
  return std::stod(out.substr(at + name.size()));
}

TEST(Cli, DigitsExampleFineTunesTheHead) {
  auto dir = digits("cli_digits");
  CliRun before = run("eval " + (dir / "config.yaml").string());
  ASSERT_EQ(before.code, 0) << before.out;
  EXPECT_LT(metric(before.out, "accuracy "), 0.3) << before.out;  // a fresh head: near chance
  CliRun r = run("train " + (dir / "config.yaml").string() + " --set train.epochs=3");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("trained model: " + (dir / "data/run/model.onnx").string()), std::string::npos) << r.out;
  EXPECT_GT(metric(r.out, "validation accuracy: "), 0.9) << r.out;
  // eval of the trained model reproduces the reported metric.
  CliRun after = run("eval " + (dir / "config.yaml").string() + " --model " + (dir / "data/run/model.onnx").string());
  ASSERT_EQ(after.code, 0) << after.out;
  EXPECT_NEAR(metric(after.out, "accuracy "), metric(r.out, "validation accuracy: "), 1e-6) << after.out;
  // Only the head moved.
  CliRun info = run("info " + (dir / "data/run/model.onnx").string());
  ASSERT_EQ(info.code, 0);
  std::string cmp = test::python() + " -c 'import onnx, numpy as np, sys\n"
                    "w = [{t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(p).graph.initializer} for p in sys.argv[1:]]\n"
                    "assert all((w[0][k] == w[1][k]).all() for k in (\"body.weight\", \"body.bias\"))\n"
                    "assert not (w[0][\"head.weight\"] == w[1][\"head.weight\"]).all()' " +
                    (dir / "data/digits.onnx").string() + " " + (dir / "data/run/model.onnx").string();
  EXPECT_EQ(std::system(cmp.c_str()), 0);
  // Export of the last checkpoint = the trained model.
  CliRun ex = run("export " + (dir / "data/run/checkpoints/step-87.onnx").string() + " -o " + (dir / "exported.onnx").string());
  ASSERT_EQ(ex.code, 0) << ex.out;
  EXPECT_EQ(read_file(dir / "exported.onnx"), read_file(dir / "data/run/model.onnx"));
}

TEST(Cli, ResumeFromACheckpointEqualsOneRun) {
  auto dir = digits("cli_resume");
  const std::string cfg = (dir / "config.yaml").string();
  const std::string common = " --set early_stopping.patience=0 --set log.progress=none --set checkpoint.every=10"
                             " --set schedule.kind=step --set schedule.step_size=20 --set schedule.gamma=0.5";
  CliRun full = run("train " + cfg + common + " --set train.epochs=2 --set output=full");
  ASSERT_EQ(full.code, 0) << full.out;
  CliRun part = run("train " + cfg + common + " --set train.epochs=2 --set train.max_steps=23 --set output=part");
  ASSERT_EQ(part.code, 0) << part.out;
  EXPECT_NE(part.out.find("stopped: max_steps after 23 steps"), std::string::npos) << part.out;
  CliRun rest = run("resume " + (dir / "part/checkpoints/step-23.onnx").string() + " --set train.max_steps=0");
  ASSERT_EQ(rest.code, 0) << rest.out;
  EXPECT_NE(rest.out.find("resuming at epoch 1, batch 23, step 23"), std::string::npos) << rest.out;
  EXPECT_EQ(read_file(dir / "part/model.onnx"), read_file(dir / "full/model.onnx"));
  // The metrics log continues: the resumed run appended its rows.
  const std::string log = read_file(dir / "part/metrics.csv");
  EXPECT_EQ(log.find("event,epoch"), 0u);
  EXPECT_EQ(log.find("event,epoch", 1), std::string::npos);
  EXPECT_NE(log.find("\nstep,2,58,"), std::string::npos);
  // Changing the training maths on resume is refused.
  CliRun bad = run("resume " + (dir / "part/checkpoints/step-23.onnx").string() + " --set optimizer.learning_rate=1");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("--set optimizer.learning_rate: cannot change when resuming"), std::string::npos) << bad.out;
}

// A run moves between devices at a checkpoint: trained on the guarded test device (a device whose memory host code
// cannot touch, docs/gpu.md), resumed on the CPU, evaluated on both with the same numbers.
TEST(Cli, ResumesOnAnotherDeviceAndEvaluatesOnEither) {
  auto dir = digits("cli_devices");
  const std::string cfg = (dir / "config.yaml").string();
  const std::string common = " --set early_stopping.patience=0 --set log.progress=none --set train.epochs=2";
  CliRun part = run("train " + cfg + common + " --set device=guarded --set train.max_steps=23 --set output=moved");
  ASSERT_EQ(part.code, 0) << part.out;
  EXPECT_NE(part.out.find("on guarded: "), std::string::npos) << part.out;
  CliRun rest = run("resume " + (dir / "moved/checkpoints/step-23.onnx").string() +
                    " --set train.max_steps=0 --set device=cpu");
  ASSERT_EQ(rest.code, 0) << rest.out;
  EXPECT_NE(rest.out.find("on cpu: "), std::string::npos) << rest.out;
  EXPECT_NE(rest.out.find("resuming at epoch 1, batch 23, step 23"), std::string::npos) << rest.out;
  const std::string model = " --model " + (dir / "moved/checkpoints/step-58.onnx").string();
  CliRun on_cpu = run("eval " + cfg + model + " --set device=cpu");
  CliRun on_guarded = run("eval " + cfg + model + " --set device=guarded");
  ASSERT_EQ(on_cpu.code, 0) << on_cpu.out;
  ASSERT_EQ(on_guarded.code, 0) << on_guarded.out;
  auto metric = [](const std::string& out, const std::string& name) {
    const size_t at = out.find(name + " ");
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + name.size() + 1));
  };
  EXPECT_GT(metric(on_cpu.out, "accuracy"), 0.5) << on_cpu.out;
  EXPECT_EQ(metric(on_guarded.out, "accuracy"), metric(on_cpu.out, "accuracy")) << on_guarded.out;
  EXPECT_NEAR(metric(on_guarded.out, "loss"), metric(on_cpu.out, "loss"), 1e-5) << on_guarded.out;
}

// The loss column of a metrics.csv's step rows.
std::vector<double> step_losses(const std::string& csv) {
  std::vector<double> out;
  std::istringstream in(csv);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("step,", 0) != 0) continue;
    size_t at = 0;
    for (int field = 0; field < 3; ++field) at = line.find(',', at) + 1;
    out.push_back(std::stod(line.substr(at)));
  }
  return out;
}

// replicas: 2 takes the steps of one session (up to float rounding), and its checkpoint resumes in one session.
TEST(Cli, ReplicasTrainTheSameStepsAndResumeAlone) {
  auto dir = digits("cli_replicas");
  const std::string cfg = (dir / "config.yaml").string();
  const std::string common = " --set early_stopping.patience=0 --set log.progress=none --set checkpoint.every=10"
                             " --set train.epochs=2 --set train.max_steps=23";
  CliRun one = run("train " + cfg + common + " --set output=one");
  ASSERT_EQ(one.code, 0) << one.out;
  CliRun two = run("train " + cfg + common + " --set output=two --set replicas=2");
  ASSERT_EQ(two.code, 0) << two.out;
  EXPECT_NE(two.out.find("replicas: 2 one-thread replicas"), std::string::npos) << two.out;
  const std::vector<double> a = step_losses(read_file(dir / "one/metrics.csv"));
  const std::vector<double> b = step_losses(read_file(dir / "two/metrics.csv"));
  ASSERT_EQ(a.size(), 23u);
  ASSERT_EQ(b.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-4 * (1 + a[i])) << "step " << i + 1;
  CliRun rest = run("resume " + (dir / "two/checkpoints/step-23.onnx").string() +
                    " --set train.max_steps=0 --set replicas=1");
  ASSERT_EQ(rest.code, 0) << rest.out;
  EXPECT_NE(rest.out.find("resuming at epoch 1, batch 23, step 23"), std::string::npos) << rest.out;
  EXPECT_EQ(rest.out.find("replicas:"), std::string::npos) << rest.out;
  CliRun bad = run("train " + cfg + " --set replicas=0");
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.out.find("replicas: expected an integer >= 1 and <= 64"), std::string::npos) << bad.out;
}

TEST(Cli, CtrlCSavesACheckpointAndResumes) {
  auto dir = digits("cli_sigint");
  const std::string common = "--set early_stopping.patience=0 --set log.progress=none --set train.epochs=30";
  CliRun full = run("train " + (dir / "config.yaml").string() + " " + common + " --set output=full");
  ASSERT_EQ(full.code, 0) << full.out;

  // The child interrupts itself right after step 12 (ONNXTRAIN_TEST_SIGINT_AT_STEP, cli/run.cpp): the real SIGINT
  // path at a known step, where a timer would race the run on a fast or a loaded machine.
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string cfg = (dir / "config.yaml").string();
    freopen((dir / "child.log").c_str(), "w", stdout);
    setenv("ONNXTRAIN_TEST_SIGINT_AT_STEP", "12", 1);
    execl(ONNXTRAIN_CLI, ONNXTRAIN_CLI, "train", cfg.c_str(), "--set", "early_stopping.patience=0", "--set",
          "log.progress=none", "--set", "train.epochs=30", "--set", "output=cut", (char*)nullptr);
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  const std::string out = read_file(dir / "child.log");
  ASSERT_EQ(WEXITSTATUS(status), 130) << out;
  EXPECT_NE(out.find("stopped: interrupted after 12 steps"), std::string::npos) << out;
  const size_t at = out.find("continue with: onnxtrain resume ");
  ASSERT_NE(at, std::string::npos) << out;
  std::string ckpt = out.substr(at + 32);
  ckpt = ckpt.substr(0, ckpt.find('\n'));
  CliRun rest = run("resume " + ckpt);
  ASSERT_EQ(rest.code, 0) << rest.out;
  EXPECT_EQ(read_file(dir / "cut/model.onnx"), read_file(dir / "full/model.onnx"));
}

TEST(Cli, CsvColumnsAndJsonLinesLog) {
  auto dir = test::temp_dir("cli_csv");
  std::string cmd = test::python() + " " + (test::source_dir() / "examples/make_mlp.py").string() + " " +
                    (dir / "mlp.onnx").string() + " --sizes 3 16 1 > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  {
    std::ofstream csv(dir / "data.csv");
    csv << "a,b,c,target\n";
    for (int i = 0; i < 200; ++i) {
      const double a = (i % 17) / 17.0, b = (i % 11) / 11.0, c = (i % 7) / 7.0;
      csv << a << "," << b << "," << c << "," << 2 * a - b + 0.5 * c << "\n";
    }
  }
  std::ofstream(dir / "run.yaml") << "model: mlp.onnx\noutput: out\n"
                                     "data:\n  train: data.csv\n  inputs: {x: [a, b, c]}\n  target: [target]\n"
                                     "  validation_split: 0.25\n"
                                     "optimizer: {kind: adam, learning_rate: 0.01}\n"
                                     "train: {epochs: 30, batch_size: 16, metrics: [loss, r2, mae], profile: true}\n"
                                     "log: {file: metrics.jsonl, progress: lines}\n";
  CliRun r = run("train " + (dir / "run.yaml").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("150 training rows, 50 validation rows"), std::string::npos) << r.out;
  EXPECT_GT(metric(r.out, "validation r2: "), 0.9) << r.out;
  // train.profile: the step table after the summary, every step of the plan called once per optimizer step.
  EXPECT_NE(r.out.find("profile of train_step (train.profile): "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  share  us/call  calls  step\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  300  node '"), std::string::npos) << r.out;  // 30 epochs x 10 batches of 16 (150 rows)
  const std::string log = read_file(dir / "out/metrics.jsonl");
  EXPECT_EQ(log.rfind("{\"event\": \"step\", \"epoch\": 1, \"step\": 1, \"loss\": ", 0), 0u) << log.substr(0, 200);
  EXPECT_NE(log.find("\"val_r2\": "), std::string::npos);
  // A column that is not in the file.
  std::ofstream(dir / "bad.yaml") << "model: mlp.onnx\ndata:\n  train: data.csv\n  inputs: {x: [a, b, d]}\n  target: target\n";
  CliRun bad = run("train " + (dir / "bad.yaml").string());
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find("bad.yaml:4: data.inputs.x: array or column 'd' for model input 'x' is not in the training data; "
                         "it has: a float64[200], b float64[200], c float64[200], target float64[200]"),
            std::string::npos) << bad.out;
}

// CastLike: an op with a kernel but no gradient rule (Mod was one until it got a rule).
TEST(Cli, InfoReportsOpsWithoutGradientRule) {
  auto dir = test::temp_dir("cli_info");
  std::string cmd = test::python() + " -c 'import onnx, numpy as np; from onnx import helper as h, TensorProto as T\n"
                    "g = h.make_graph([h.make_node(\"Mul\", [\"x\", \"w\"], [\"m\"]), h.make_node(\"Unique\", [\"m\"], [\"y\"])], \"g\",\n"
                    "  [h.make_tensor_value_info(\"x\", T.FLOAT, [\"n\", 3, 3])], [h.make_tensor_value_info(\"y\", T.FLOAT, [\"k\"])],\n"
                    "  [onnx.numpy_helper.from_array(np.ones(3, np.float32), \"w\")])\n"
                    "onnx.save(h.make_model(g, opset_imports=[h.make_opsetid(\"\", 18)]), \"" + (dir / "unique.onnx").string() + "\")'";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  CliRun r = run("info " + (dir / "unique.onnx").string());
  ASSERT_EQ(r.code, 3) << r.out;  // not trainable: an op without a CPU kernel
  EXPECT_NE(r.out.find("  x: float32 [n, 3, 3]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  w: float32 [3] 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("no gradient rule: Unique (1 nodes) -- on a weight's path"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("no CPU kernel: Unique (1 nodes)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("trainable: no (ops without a CPU kernel)"), std::string::npos) << r.out;
  // An op with a kernel but no rule on a weight's path: partly trainable, its own exit status.
  cmd = test::python() + " -c 'import onnx, numpy as np; from onnx import helper as h, TensorProto as T\n"
        "g = h.make_graph([h.make_node(\"Mul\", [\"x\", \"w\"], [\"m\"]),\n"
        "  h.make_node(\"GeluGrad\", [\"x\", \"m\"], [\"y\"], domain=\"onnxtrain\")], \"g\",\n"
        "  [h.make_tensor_value_info(\"x\", T.FLOAT, [\"n\", 3])], [h.make_tensor_value_info(\"y\", T.FLOAT, [\"n\", 3])],\n"
        "  [onnx.numpy_helper.from_array(np.ones(3, np.float32), \"w\")])\n"
        "onnx.save(h.make_model(g, opset_imports=[h.make_opsetid(\"\", 18), h.make_opsetid(\"onnxtrain\", 1)]), \"" +
        (dir / "partly.onnx").string() + "\")'";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  CliRun partly = run("info " + (dir / "partly.onnx").string());
  EXPECT_EQ(partly.code, 4) << partly.out;
  EXPECT_NE(partly.out.find("trainable: partly"), std::string::npos) << partly.out;
  // Not a model at all: 2, with the reason.
  std::ofstream(dir / "bad.onnx") << "not a protobuf";
  CliRun bad = run("info " + (dir / "bad.onnx").string());
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("not a valid ONNX model"), std::string::npos) << bad.out;
  // A model that trains: 0.
  CliRun ok = run("info " + test::make_mlp(dir, "4 8 1").string());
  EXPECT_EQ(ok.code, 0) << ok.out;
  EXPECT_NE(ok.out.find("trainable: yes"), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find("mixed precision on this CPU: bfloat16 MatMul/Gemm: "), std::string::npos) << ok.out;
}

TEST(Cli, ExitCodesAndHelp) {
  EXPECT_EQ(run("").code, 2);
  EXPECT_EQ(run("frobnicate").code, 2);
  for (const char* c : {"train", "resume", "eval", "export", "info", "config", "ops", "gradient-graph"}) {
    CliRun h = run(std::string(c) + " --help");
    EXPECT_EQ(h.code, 0) << c;
    EXPECT_EQ(h.out.rfind(std::string("usage: onnxtrain ") + c, 0), 0u) << h.out;
  }
  CliRun noarg = run("train");
  EXPECT_EQ(noarg.code, 2);
  EXPECT_NE(noarg.out.find("onnxtrain train: expected one config file"), std::string::npos) << noarg.out;
  EXPECT_EQ(run("train --frob x.yaml").code, 2);
  auto dir = test::temp_dir("cli_codes");
  std::ofstream(dir / "c.yaml") << "model: nowhere.onnx\ndata: {train: t.npz}\nloss: {kind: hinge}\n";
  CliRun cfg = run("train " + (dir / "c.yaml").string());
  EXPECT_EQ(cfg.code, 2);
  EXPECT_NE(cfg.out.find("c.yaml:3: loss.kind: expected one of:"), std::string::npos) << cfg.out;
  std::ofstream(dir / "m.yaml") << "model: nowhere.onnx\ndata: {train: t.npz}\n";
  CliRun missing = run("train " + (dir / "m.yaml").string());
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.out.find("t.npz: cannot open the file"), std::string::npos) << missing.out;
  CliRun notckpt = run("resume " + (dir / "m.yaml").string());
  EXPECT_EQ(notckpt.code, 2) << notckpt.out;
}

// The config runs as shipped, not with fewer epochs: its 10 epochs take under a second, and docs/cli.md quotes the
// accuracy of exactly this run. Both convolutions have 8+ output channels, so with AVX-512 this trains on DirectConv.
TEST(Cli, CnnExampleTrainsFromScratch) {
  auto dir = example("cnn", "cli_cnn");
  CliRun before = run("eval " + (dir / "config.yaml").string());
  ASSERT_EQ(before.code, 0) << before.out;
  EXPECT_LT(metric(before.out, "accuracy "), 0.3) << before.out;  // untrained: near chance
  CliRun r = run("train " + (dir / "config.yaml").string() + " --set log.progress=none");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("trained model: " + (dir / "data/run/model.onnx").string()), std::string::npos) << r.out;
  EXPECT_GT(metric(r.out, "validation accuracy: "), 0.9) << r.out;
  // Without `trainable:` every weight trains: conv1, whose input is data, too (its gradient skips dX).
  std::string cmp = test::python() + " -c 'import onnx, sys\n"
                    "w = [{t.name: onnx.numpy_helper.to_array(t) for t in onnx.load(p).graph.initializer}\n"
                    "     for p in sys.argv[1:]]\n"
                    "names = [l + s for l in (\"conv1\", \"conv2\", \"head\") for s in (\".weight\", \".bias\")]\n"
                    "assert sorted(w[0]) == sorted(w[1]) == sorted(names), sorted(w[1])\n"
                    "assert all((w[0][k] != w[1][k]).any() for k in names)' " +
                    (dir / "data/cnn.onnx").string() + " " + (dir / "data/run/model.onnx").string();
  EXPECT_EQ(std::system(cmp.c_str()), 0);
}

// examples/cnn/recompute.yaml (memory.recompute: [conv2, relu2], docs/memory.md) trains the same weights, to the
// bit, as the same run without recomputation; its checkpoints record the option and carry the recomputing step.
TEST(Cli, CnnRecomputeExampleTrainsTheSameBits) {
  auto dir = example("cnn", "cli_cnn_recompute");
  std::filesystem::copy_file(test::source_dir() / "examples/cnn/recompute.yaml", dir / "recompute.yaml");
  const std::string common = " --set log.progress=none --set train.max_steps=30 --set checkpoint.every=30";
  CliRun re = run("train " + (dir / "recompute.yaml").string() + common);
  ASSERT_EQ(re.code, 0) << re.out;
  CliRun plain = run("train " + (dir / "recompute.yaml").string() + common + " --set memory.recompute=none --set output=plain");
  ASSERT_EQ(plain.code, 0) << plain.out;
  EXPECT_EQ(read_file(dir / "data/run-recompute/model.onnx"), read_file(dir / "plain/model.onnx"));
  std::string cmp = test::python() + " -c 'import onnx, sys\n"
                    "m = onnx.load(sys.argv[1])\n"
                    "meta = {p.key: p.value for p in m.metadata_props}\n"
                    "assert [v for k, v in meta.items() if k.endswith(\"memory.recompute\")] == [\"conv2\\nrelu2\"], meta\n"
                    "names = [n.name for n in m.training_info[0].algorithm.node]\n"
                    "assert sorted(n for n in names if n.startswith(\"recompute/\")) == [\"recompute/conv2\", \"recompute/relu2\"], names\n"
                    "onnx.checker.check_model(m)' " + (dir / "data/run-recompute/checkpoints/step-30.onnx").string();
  EXPECT_EQ(std::system(cmp.c_str()), 0);
  CliRun bad = run("train " + (dir / "recompute.yaml").string() + common + " --set 'memory.recompute=[nothing*]'");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("memory.recompute: 'nothing*' matches no node"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace onnxtrain
