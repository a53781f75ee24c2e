#include "pipeflow/nn/safetensors.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <vector>

#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/nn/model_file.h"
#include "pipeflow/nn/safetensors_index.h"
#include "test_support.h"
#include "../support/temp_dir.h"

namespace pipeflow::nn {
namespace {

std::string serialized_pair() {
  SafetensorsWriter writer;
  const std::vector<float> weights = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f};
  const std::vector<std::int32_t> tokens = {72, 105, 33};
  writer.add("h.0.attn.c_attn.weight", weights, {2, 3});
  writer.add("tokens", tokens, {1, 3});
  writer.set_metadata("n_layer", "1");
  return writer.serialize();
}

// The error parsing `bytes` as w.safetensors gives, or "(no error)".
std::string parse_error(const std::string& bytes) {
  return testing::error_of([&] { SafetensorsFile::parse(bytes, "w.safetensors"); });
}

TEST(Safetensors, HeaderIsALittleEndianLengthThenJsonThenData) {
  const std::string bytes = serialized_pair();
  std::uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  EXPECT_EQ(length % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + length + 6 * 4 + 3 * 4);
  const auto header = nlohmann::json::parse(bytes.substr(8, length));
  EXPECT_EQ(header["h.0.attn.c_attn.weight"]["dtype"], "F32");
  EXPECT_EQ(header["h.0.attn.c_attn.weight"]["shape"], nlohmann::json::array({2, 3}));
  EXPECT_EQ(header["h.0.attn.c_attn.weight"]["data_offsets"], nlohmann::json::array({0, 24}));
  EXPECT_EQ(header["tokens"]["dtype"], "I32");
  EXPECT_EQ(header["tokens"]["data_offsets"], nlohmann::json::array({24, 36}));
  EXPECT_EQ(header["__metadata__"]["n_layer"], "1");
  float first = 0;
  std::memcpy(&first, bytes.data() + 8 + length, 4);
  EXPECT_EQ(first, 1.5f);
}

// Each tensor's checksum is the CRC-32 (IEEE, zlib's) of its bytes: the
// expected values are Python's zlib.crc32 of the same bytes, b"12345678" and
// bytes(range(256)) * 64, so files written by earlier pipeflows and by other
// tools that follow the convention still check.
TEST(Safetensors, EachTensorsChecksumIsTheCrc32OfItsBytes) {
  SafetensorsWriter writer;
  std::vector<std::int32_t> digits(2);
  std::memcpy(digits.data(), "12345678", 8);
  writer.add("digits", digits, {1, 2});
  std::vector<std::int32_t> ramp(16384 / 4);
  for (std::size_t i = 0; i < 16384; ++i) reinterpret_cast<unsigned char*>(ramp.data())[i] = static_cast<unsigned char>(i);
  writer.add("ramp", ramp, {64, 64});
  const SafetensorsFile file = SafetensorsFile::parse(writer.serialize(), "crc.safetensors");
  EXPECT_EQ(file.metadata("crc32.digits"), "9ae0daaf");
  EXPECT_EQ(file.metadata("crc32.ramp"), "e81722f0");
}

TEST(Safetensors, RoundTripsTensorsAndMetadataThroughAFile) {
  const auto path = std::filesystem::path(pipeflow::testing::make_temp_dir()) / "roundtrip.safetensors";
  write_file_atomic(path, serialized_pair());
  const SafetensorsFile file = SafetensorsFile::read(path);
  EXPECT_EQ(file.names(), (std::vector<std::string>{"h.0.attn.c_attn.weight", "tokens"}));
  const Tensor weights = file.floats("h.0.attn.c_attn.weight");
  EXPECT_EQ(weights.shape(), Shape({2, 3}));
  EXPECT_EQ(weights[2], 3.25f);
  EXPECT_EQ(file.ints("tokens")[1], 105);
  EXPECT_EQ(file.metadata("n_layer"), "1");
}

TEST(Safetensors, TruncatedAndCorruptFilesAreErrorsNamingTheFileAndTheProblem) {
  const std::string good = serialized_pair();
  EXPECT_EQ(parse_error(good.substr(0, 5)),
            "w.safetensors: truncated safetensors file: 5 bytes, shorter than the 8-byte header length");
  EXPECT_EQ(parse_error(good.substr(0, 40)),
            "w.safetensors: header length 240 runs past the end of the file (40 bytes): truncated or not a "
            "safetensors file");
  EXPECT_EQ(parse_error(good.substr(0, good.size() - 4)),
            "w.safetensors: tensor tokens: ends at data byte 36 but the file holds only 32 data bytes: the file "
            "is truncated");
  EXPECT_EQ(parse_error(good + "xxxx"),
            "w.safetensors: 4 bytes after the last tensor: corrupt file or a wrong header");
  std::string corrupt = good;
  corrupt[8] = '[';
  EXPECT_NE(parse_error(corrupt).find("w.safetensors header: not valid JSON"), std::string::npos);
  // A header of 100 000 nested '[' used to overflow the stack in dump().
  const std::string deep(100'000, '[');
  const std::uint64_t deep_length = deep.size();
  EXPECT_NE(parse_error(std::string(reinterpret_cast<const char*>(&deep_length), 8) + deep)
                .find("w.safetensors header: JSON nested deeper than the limit of 64 levels"),
            std::string::npos);
  auto with_header = [](const std::string& json, std::size_t data_bytes) {
    std::string text = json;
    const std::uint64_t length = text.size();
    return std::string(reinterpret_cast<const char*>(&length), 8) + text + std::string(data_bytes, '\0');
  };
  EXPECT_EQ(parse_error(with_header(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)),
            "w.safetensors: tensor a: F32 [3] needs 12 bytes but data_offsets [0, 8] span 8");
  EXPECT_EQ(parse_error(with_header(R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", 16)),
            "w.safetensors: tensor a: dtype F64 is not supported (pipeflow reads F32, BF16, F16 and I32)");
  EXPECT_EQ(parse_error(with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8)),
            "w.safetensors: tensor data is not contiguous (a gap or overlap at data byte 0): corrupt file");
  // 2^62 · 4 elements of 4 bytes wrap to 0 bytes in 64 bits, 2^64 − 1 is no int64: neither may pass.
  EXPECT_EQ(parse_error(with_header(R"({"a":{"dtype":"I32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})", 0)),
            "w.safetensors: tensor a: shape [4611686018427387904,4] has more than 2^60 elements: a corrupt header");
  EXPECT_EQ(parse_error(with_header(R"({"a":{"dtype":"I32","shape":[1073741824,2147483648],"data_offsets":[0,0]}})", 0)),
            "w.safetensors: tensor a: shape [1073741824,2147483648] has more than 2^60 elements: a corrupt header");
  EXPECT_EQ(parse_error(with_header(R"({"a":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,0]}})", 0)),
            "w.safetensors: tensor a: shape [18446744073709551615] has more than 2^60 elements: a corrupt header");
}

// Hugging Face's checkpoints hold BF16 (and F16) tensors: read as floats,
// exactly (each value one of the format's). The bytes here are 1.0, -2.5,
// 65504 and the smallest subnormal in each format.
TEST(Safetensors, Bf16AndF16TensorsReadAsFloats) {
  const std::string bf16("\x80\x3f\x20\xc0\x80\x47\x01\x00", 8);  // 1, -2.5, 65536, 2^-133
  const std::string f16("\x00\x3c\x00\xc1\xff\x7b\x01\x00", 8);   // 1, -2.5, 65504, 2^-24
  std::string header = R"({"a":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"F16","shape":[2,2],"data_offsets":[8,16]}})";
  header += std::string((8 - header.size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  const std::uint64_t length = header.size();
  std::memcpy(bytes.data(), &length, 8);
  bytes += header + bf16 + f16;
  const SafetensorsFile file = SafetensorsFile::parse(bytes, "half.safetensors");
  EXPECT_EQ(file.floats("a").span()[0], 1.0f);
  EXPECT_EQ(file.floats("a").span()[1], -2.5f);
  EXPECT_EQ(file.floats("a").span()[2], 65536.0f);
  EXPECT_EQ(file.floats("a").span()[3], 0x1p-133f);
  std::vector<float> out(4);
  file.read_floats("b", Shape({2, 2}), out);
  EXPECT_EQ(out, (std::vector<float>{1.0f, -2.5f, 65504.0f, 0x1p-24f}));
  EXPECT_EQ(file.entry("b").dtype, Dtype::kF16);
}

TEST(Safetensors, WrongShapeOrDtypeOrMissingTensorNameTheTensor) {
  const SafetensorsFile file = SafetensorsFile::parse(serialized_pair(), "w.safetensors");
  std::vector<float> out(6);
  using testing::error_of;
  EXPECT_EQ(error_of([&] { file.read_floats("h.0.attn.c_attn.weight", {3, 2}, out); }),
            "w.safetensors: tensor h.0.attn.c_attn.weight has shape [2, 3], expected [3, 2]");
  EXPECT_EQ(error_of([&] { file.floats("tokens"); }), "w.safetensors: tensor tokens is I32, expected a float tensor");
  EXPECT_EQ(error_of([&] { file.floats("wte.weight"); }), "w.safetensors: no tensor wte.weight in the file (2 tensors)");
  EXPECT_EQ(error_of([&] { read_config(file); }), "w.safetensors: no vocab_size in the __metadata__ of the file");
}

TEST(ModelFile, WeightsRoundTripWithTheShapeInTheMetadata) {
  const ModelConfig config{.vocab_size = 256, .context = 8, .n_layer = 2, .n_head = 2, .n_embd = 16};
  Stage model(config, all_layers(config));
  model.init_parameters(3);
  const auto path = std::filesystem::path(pipeflow::testing::make_temp_dir()) / "model.safetensors";
  write_weights(path, model);
  const SafetensorsFile file = SafetensorsFile::read(path);
  EXPECT_EQ(read_config(file), config);
  EXPECT_EQ(file.metadata("n_ctx"), "8");
  EXPECT_EQ(file.entry("h.1.mlp.c_fc.weight").shape, Shape({16, 64}));  // Conv1D [in, out]
  Stage tail(config, {2, 4});
  load_parameters(tail, file);  // a stage takes its own tensors from a whole-model file
  const auto expected = model.parameter("h.1.mlp.c_proj.weight");
  const auto loaded = tail.parameter("h.1.mlp.c_proj.weight");
  EXPECT_TRUE(std::equal(expected.begin(), expected.end(), loaded.begin()));
  EXPECT_TRUE(std::equal(model.parameter("wte.weight").begin(), model.parameter("wte.weight").end(),
                         tail.parameter("wte.weight").begin()));
}

// A file holding h.2.* for a model of 2 blocks drops them when loaded: its
// metadata is wrong, or it is another model's. Names of no parameter pass.
TEST(ModelFile, TensorsNamedAsParametersTheModelDoesNotTakeAreRefused) {
  const ModelConfig gpt2{.vocab_size = 256, .context = 8, .n_layer = 2, .n_head = 2, .n_embd = 16};
  const auto taken = [](const ModelConfig& config, const std::vector<std::string>& names) {
    SafetensorsWriter writer;
    const std::vector<float> value = {0};
    for (const std::string& name : names) writer.add(name, value, {1});
    return testing::error_of(
        [&] { check_tensors_taken(SafetensorsFile::parse(writer.serialize(), "w.safetensors"), config); });
  };
  const std::string model = "(GPT-2, 2 layers, width 16, 2 heads, context 8, vocabulary 256)";
  EXPECT_EQ(taken(gpt2, {"wte.weight", "h.1.ln_1.weight", "exp_avg.h.1.ln_1.weight", "exp_avg_sq.wte.weight",
                         "grad.h.0.mlp.c_fc.bias", "tokens", "logits", "h.0.attn.bias", "h.7.attn.masked_bias"}),
            "(no error)");
  EXPECT_EQ(taken(gpt2, {"wte.weight", "h.1.ln_1.weight", "h.2.ln_1.weight", "h.3.ln_1.weight"}),
            "w.safetensors: tensor h.2.ln_1.weight is not a parameter of the model its metadata describes " + model +
                ": a file whose tensors the model does not all take is another model's, or its metadata is wrong; "
                "give this model's weights, or correct n_layer in its metadata (a Hugging Face checkpoint's: in the "
                "config.json beside it)");
  EXPECT_NE(taken(gpt2, {"exp_avg_sq.h.12.mlp.c_proj.weight"}).find("tensor exp_avg_sq.h.12.mlp.c_proj.weight is not"),
            std::string::npos);

  ModelConfig llama = gpt2;
  llama.family = Family::kLlama;
  EXPECT_EQ(taken(llama, {"model.layers.1.mlp.up_proj.weight", "model.layers.0.self_attn.rotary_emb.inv_freq"}),
            "(no error)");
  EXPECT_NE(taken(llama, {"model.layers.2.mlp.up_proj.weight"}).find("tensor model.layers.2.mlp.up_proj.weight is not"),
            std::string::npos);
  // A tied Llama's head is the embedding: an lm_head.weight of its own says the metadata is wrong.
  EXPECT_NE(taken(llama, {"lm_head.weight"}).find("tensor lm_head.weight is not a parameter"), std::string::npos);
  EXPECT_NE(taken(llama, {"lm_head.weight"}).find("correct n_layer or tie_word_embeddings"), std::string::npos);
  llama.tied_embeddings = false;
  EXPECT_EQ(taken(llama, {"lm_head.weight"}), "(no error)");
}

// Hugging Face's sharded layout: the shards and an index naming each
// tensor's shard; the reader merges them, and refuses an index that does
// not match its shards, or a folder without one.
TEST(ShardedSafetensors, ShardsAndTheirIndexReadAsOneFile) {
  const std::filesystem::path folder = pipeflow::testing::make_temp_dir();
  EXPECT_EQ(shard_file_name(0, 2), "model-00001-of-00002.safetensors");
  EXPECT_TRUE(is_shard_file_name("model-00002-of-00002.safetensors"));
  EXPECT_FALSE(is_shard_file_name("model-2-of-2.safetensors"));
  const std::vector<float> a = {1, 2, 3}, b = {4, 5};
  SafetensorsWriter first, second;
  first.add("a", a, {3});
  first.set_metadata("steps_done", "7");
  second.add("b", b, {2});
  first.write(folder / shard_file_name(0, 2));
  second.write(folder / shard_file_name(1, 2));
  using testing::error_of;
  EXPECT_EQ(error_of([&] { read_sharded(folder); }),
            folder.string() + ": no model.safetensors.index.json: the checkpoint is incomplete (its index is written "
                              "last, after every shard: a writer stopped before it); resume from another checkpoint");
  write_safetensors_index(folder, {{shard_file_name(0, 2), first.names(), first.data_bytes()},
                                   {shard_file_name(1, 2), second.names(), second.data_bytes()}});
  const auto index = nlohmann::json::parse(read_file(folder / kSafetensorsIndex));
  EXPECT_EQ(index["metadata"]["total_size"], 20);
  EXPECT_EQ(index["weight_map"]["b"], "model-00002-of-00002.safetensors");
  const SafetensorsFile merged = read_sharded(folder);
  EXPECT_EQ(merged.source(), (folder / kSafetensorsIndex).string());
  EXPECT_EQ(merged.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(merged.floats("b")[1], 5.0f);
  EXPECT_EQ(merged.metadata("steps_done"), "7");
  EXPECT_EQ(read_sharded_metadata(folder).metadata("steps_done"), "7");

  write_safetensors_index(folder, {{shard_file_name(0, 2), {"a", "b"}, 20}});
  EXPECT_EQ(error_of([&] { read_sharded(folder); }),
            (folder / kSafetensorsIndex).string() + ": maps tensor b to " +
                (folder / shard_file_name(0, 2)).string() + ", which does not hold it");
  write_safetensors_index(folder, {{shard_file_name(0, 2), {"b"}, 8}, {shard_file_name(1, 2), {"a"}, 12}});
  EXPECT_EQ(error_of([&] { read_sharded(folder); }),
            (folder / shard_file_name(0, 2)).string() + ": holds tensor a, which " +
                (folder / kSafetensorsIndex).string() +
                " maps to model-00002-of-00002.safetensors: the shard does not belong to this index");
  write_file_atomic(folder / kSafetensorsIndex, R"({"weight_map": {"a": "../a.safetensors"}})");
  EXPECT_EQ(error_of([&] { read_sharded(folder); }),
            (folder / kSafetensorsIndex).string() +
                ": weight_map.a = \"../a.safetensors\" must name a file of the folder (no directories)");
}

}  // namespace
}  // namespace pipeflow::nn
