// safetensors: a round trip of every dtype, a file checked byte by byte against the format's
// specification, and every malformed file refused with a message naming the file and the fault.
#include "xlme/checkpoint/safetensors.h"

#include "xlme/common/json.h"

#include "hostile_fixtures.h"
#include "memory_fixtures.h"
#include "test_util.h"

#include <fmt/format.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <filesystem>
#include <set>

namespace xlme::checkpoint {
namespace {

using xlme::describe_json;
using xlme::json_excerpt;
using xlme::kJsonExcerpt;
using xlme::kMaxJsonDepth;
using xlme::parse_json;

using xlme::testing::contains_all;
using xlme::testing::error_message;
using xlme::testing::nested_json_array;
using xlme::testing::raw_safetensors;
using xlme::testing::read_file;
using xlme::testing::TempDir;
using xlme::testing::write_file;

std::string parse_error(const std::string& bytes) {
  return error_message([&] { parse_safetensors(bytes, "m.safetensors"); });
}

TEST(Safetensors, RoundTripsEveryDtypeShapeAndMetadata) {
  torch::manual_seed(0);
  SafetensorsContent content;
  const auto values = torch::randn({3, 5}) * 100;
  content.tensors["f64"] = values.to(torch::kFloat64);
  content.tensors["f32"] = values;
  content.tensors["f16"] = values.to(torch::kFloat16);
  content.tensors["bf16"] = values.to(torch::kBFloat16);
  content.tensors["i64"] = torch::randint(-(int64_t{1} << 40), int64_t{1} << 40, {4}, torch::kLong);
  content.tensors["i32"] = torch::randint(-100000, 100000, {2, 2, 2}, torch::kInt32);
  content.tensors["i16"] = torch::randint(-30000, 30000, {7}, torch::kInt16);
  content.tensors["i8"] = torch::randint(-128, 127, {7}, torch::kInt8);
  content.tensors["u8"] = torch::randint(0, 255, {9}, torch::kUInt8);
  content.tensors["bool"] = torch::rand({3, 3}) > 0.5;
  content.tensors["scalar"] = torch::tensor(2.5);
  content.tensors["empty"] = torch::zeros({0, 3});
  content.tensors["transposed"] = values.t();  // not contiguous
  content.metadata = {{"format", "pt"}, {"note", "quotes \" and\nnewlines"}};

  TempDir dir;
  write_safetensors(dir / "all.safetensors", content);
  EXPECT_EQ(read_file(dir / "all.safetensors"), safetensors_bytes(content));
  const auto back = read_safetensors(dir / "all.safetensors");
  EXPECT_EQ(back.metadata, content.metadata);
  ASSERT_EQ(back.tensors.size(), content.tensors.size());
  for (const auto& [name, tensor] : content.tensors) {
    SCOPED_TRACE(name);
    const auto& read = back.tensors.at(name);
    EXPECT_EQ(read.scalar_type(), tensor.scalar_type());
    EXPECT_EQ(read.sizes(), tensor.sizes());
    EXPECT_TRUE(torch::equal(read, tensor));
  }
  // Nothing but the file is left beside it.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);
}

TEST(Safetensors, WritesTheSpecifiedBytes) {
  SafetensorsContent content;
  content.tensors["b"] = torch::tensor({1, -2}, torch::kInt32);
  content.tensors["a"] = torch::tensor({1.5f});
  content.metadata = {{"k", "v"}};
  // 133 bytes of JSON + 3 spaces = 136, a multiple of 8; tensors in name order: a then b.
  const std::string header =
      R"({"__metadata__":{"k":"v"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("b":{"dtype":"I32","shape":[2],"data_offsets":[4,12]}}   )";
  const std::string expected = std::string("\x88\0\0\0\0\0\0\0", 8) + header +
                               std::string("\x00\x00\xc0\x3f", 4) +  // 1.5f
                               std::string("\x01\x00\x00\x00", 4) +  // 1
                               std::string("\xfe\xff\xff\xff", 4);   // -2
  EXPECT_EQ(safetensors_bytes(content), expected);
}

// A file-size limit (`ulimit -f`) on this process while in scope, with SIGXFSZ ignored, so that a
// write past it fails with EFBIG instead of ending the process.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &old_);
    rlimit limit = old_;
    limit.rlim_cur = bytes;
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    ::setrlimit(RLIMIT_FSIZE, &limit);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit old_{};
  void (*old_handler_)(int) = SIG_DFL;
};

// The names in `dir`.
std::set<std::string> names_in(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

TEST(Safetensors, AFailedWriteKeepsTheOldFileAndLeavesNoTemporary) {
  TempDir dir;
  const std::string path = dir / "model.safetensors";
  write_file(path, "the previous export");
  SafetensorsContent content;
  content.tensors["big"] = torch::ones({1 << 18});  // 1 MiB of data
  {
    const FileSizeLimit limit(64 << 10);
    EXPECT_TRUE(contains_all(error_message([&] { write_safetensors(path, content); }),
                             {"cannot write '" + path + "'", "file-size limit", "needed ~1.0 MB",
                              "the files written before are untouched"}));
  }
  EXPECT_EQ(read_file(path), "the previous export");
  EXPECT_EQ(names_in(dir.path()), std::set<std::string>{"model.safetensors"});
  // A tensor that cannot be written: refused before any byte is.
  content.tensors["undefined"] = torch::Tensor();
  EXPECT_TRUE(contains_all(error_message([&] { write_safetensors(path, content); }),
                           {"tensor 'undefined' is undefined and cannot be written"}));
  EXPECT_EQ(read_file(path), "the previous export");
  EXPECT_EQ(names_in(dir.path()), std::set<std::string>{"model.safetensors"});
}

TEST(Safetensors, RefusesMalformedFilesSayingWhatIsWrong) {
  const std::string f32x2 = std::string(8, '\0');
  EXPECT_TRUE(
      contains_all(parse_error("abc"),
                   {"'m.safetensors' is 3 bytes long, shorter than its 8-byte header size"}));
  EXPECT_TRUE(contains_all(parse_error(std::string("\x64\0\0\0\0\0\0\0", 8) + "0123456789"),
                           {"'m.safetensors' announces a 100-byte header but the file has only 10 "
                            "bytes"}));
  EXPECT_TRUE(contains_all(parse_error(raw_safetensors("{\"a\": ", "")),
                           {"'m.safetensors': the header is not valid JSON"}));
  EXPECT_TRUE(
      contains_all(parse_error(raw_safetensors(
                       R"({"a":{"dtype":"F8","shape":[2],"data_offsets":[0,2]}})", "xx")),
                   {"tensor 'a' has the unknown dtype \"F8\"; known: F64, F32, F16, BF16"}));
  EXPECT_TRUE(contains_all(
      parse_error(
          raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "xxxx")),
      {"tensor 'a' (F32 of shape [2]) needs 8 bytes but its data_offsets [0, 4] span 4"}));
  EXPECT_TRUE(contains_all(parse_error(raw_safetensors(
                               R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", f32x2)),
                           {"data_offsets of tensor 'a' must be [begin, end] with 0 <= begin <= "
                            "end, got a list [8, 0]"}));
  EXPECT_TRUE(
      contains_all(parse_error(raw_safetensors(
                       R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f32x2)),
                   {"the shape of tensor 'a' holds an integer -2, not a size"}));
  EXPECT_TRUE(contains_all(
      parse_error(raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                  R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                  std::string(12, '\0'))),
      {"tensors 'a' and 'b' overlap (bytes [0, 8) and [4, 12) of the data)"}));
  EXPECT_TRUE(contains_all(
      parse_error(raw_safetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                  R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                                  std::string(12, '\0'))),
      {"bytes [4, 8) of the data belong to no tensor (before 'b')"}));
  EXPECT_TRUE(contains_all(
      parse_error(raw_safetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                                  std::string(12, '\0'))),
      {"the data region has 12 bytes but the tensors cover only 4; 8 bytes at the end belong to "
       "no tensor"}));
  EXPECT_TRUE(contains_all(parse_error(raw_safetensors(R"({"__metadata__":{"k":1}})", "")),
                           {"__metadata__ value of 'k' is an integer 1, not a string"}));
  EXPECT_TRUE(contains_all(parse_error(raw_safetensors(R"([1, 2])", "")),
                           {"the header is not a JSON object"}));

  // A file cut short names the file and the shortfall.
  SafetensorsContent content;
  content.tensors["a"] = torch::zeros({3});
  TempDir dir;
  const std::string whole = safetensors_bytes(content);
  write_file(dir / "cut.safetensors", whole.substr(0, whole.size() - 4));
  EXPECT_TRUE(contains_all(error_message([&] { read_safetensors(dir / "cut.safetensors"); }),
                           {"safetensors file '" + (dir / "cut.safetensors") +
                                "' is truncated: its tensors need 12 bytes of data but the file "
                                "holds 8",
                            "re-export"}));
  EXPECT_TRUE(contains_all(error_message([&] { read_safetensors(dir / "none.safetensors"); }),
                           {"'" + (dir / "none.safetensors") + "' not found"}));
}

TEST(Safetensors, RefusesUnsupportedDtypesAndNames) {
  SafetensorsContent content;
  content.tensors["c"] = torch::zeros({2}, torch::kComplexFloat);
  EXPECT_TRUE(contains_all(error_message([&] { safetensors_bytes(content); }),
                           {"tensor 'c' has dtype ComplexFloat", "F64, F32"}));
  content.tensors.clear();
  content.tensors["__metadata__"] = torch::zeros({2});
  EXPECT_TRUE(contains_all(error_message([&] { safetensors_bytes(content); }),
                           {"cannot be named '__metadata__'"}));
}

TEST(Safetensors, RefusesShapesWhoseSizeOverflowsNamingTheTensor) {
  // 2^40 x 2^40 F32 elements: 2^82 bytes, which wraps to 0 in 64-bit arithmetic, so that the
  // empty span [0, 0] matched it and LibTorch failed on the allocation.
  EXPECT_TRUE(contains_all(
      parse_error(raw_safetensors(
          R"({"w":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,0]}})",
          "")),
      {"safetensors file 'm.safetensors': tensor 'w' (F32 of shape [1099511627776, "
       "1099511627776]) would need more than 2^63 bytes (its size overflows)"}));
  // A zero size makes the tensor empty, but the other sizes must still fit LibTorch's strides.
  EXPECT_TRUE(contains_all(
      parse_error(raw_safetensors(
          R"({"w":{"dtype":"U8","shape":[0,4294967296,4294967296],"data_offsets":[0,0]}})", "")),
      {"tensor 'w' (U8 of shape [0, 4294967296, 4294967296]) would need more than 2^63 bytes"}));
  // A size beyond int64 is not a size; the largest product that fits is only truncated data.
  EXPECT_TRUE(contains_all(
      parse_error(raw_safetensors(
          R"({"w":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,0]}})", "")),
      {"the shape of tensor 'w' holds an integer 9223372036854775808, not a size"}));
  EXPECT_TRUE(contains_all(
      parse_error(raw_safetensors(
          R"({"w":{"dtype":"U8","shape":[9223372036854775807],"data_offsets":[0,9223372036854775807]}})",
          "")),
      {"is truncated: its tensors need 9223372036854775807 bytes of data but the file holds 0"}));
  std::string many_dims = "1";
  for (int i = 0; i < 64; ++i) many_dims += ",1";
  EXPECT_TRUE(contains_all(
      parse_error(raw_safetensors(
          R"({"w":{"dtype":"U8","shape":[)" + many_dims + R"(],"data_offsets":[0,1]}})", "x")),
      {"tensor 'w' has 65 dimensions; at most 64 are read"}));
  // Empty tensors of sane shapes stay readable.
  const auto content = parse_safetensors(
      raw_safetensors(R"({"w":{"dtype":"F32","shape":[0,1048576],"data_offsets":[0,0]}})", ""),
      "m.safetensors");
  EXPECT_EQ(content.tensors.at("w").sizes(), (std::vector<int64_t>{0, 1048576}));
}

TEST(Safetensors, RefusesDeepJsonAndNeverPrintsAWholeValue) {
  // 100000 levels: the old reader parsed them, then dump()ed the dtype into its message and
  // overflowed the stack.
  const std::string deep = nested_json_array(100000);
  EXPECT_TRUE(contains_all(
      parse_error(raw_safetensors(
          R"({"w":{"dtype":)" + deep + R"(,"shape":[1],"data_offsets":[0,4]}})", "xxxx")),
      {"safetensors file 'm.safetensors': the header is nested too deeply: more than 64 levels"}));
  EXPECT_TRUE(
      contains_all(parse_error(raw_safetensors(R"({"__metadata__":{"k":)" + deep + "}}", "")),
                   {"safetensors file 'm.safetensors': the header is nested too deeply"}));
  // A huge value within the depth limit is described by its start.
  const std::string huge(1000000, 'x');
  const std::string message = parse_error(raw_safetensors(
      R"({"w":{"dtype":")" + huge + R"(","shape":[1],"data_offsets":[0,4]}})", "xxxx"));
  EXPECT_TRUE(
      contains_all(message, {"tensor 'w' has the unknown dtype \"xxxx", "...; known: F64"}));
  EXPECT_LT(message.size(), 300u);
}

TEST(Safetensors, ReadsTheHeaderAloneAndOnlyTheNamedTensors) {
  // A tensor declared as 1 GiB on a sparse file (a few bytes on disk): the header and the
  // tensors asked for are read, the large one is never allocated.
  TempDir dir;
  const std::string path = dir / "m.safetensors";
  const uint64_t huge = uint64_t{1} << 30;
  write_file(path,
             raw_safetensors(
                 fmt::format(R"({{"a":{{"dtype":"F32","shape":[2],"data_offsets":[0,8]}},)"
                             R"("extra":{{"dtype":"F32","shape":[{}],"data_offsets":[8,{}]}}}})",
                             huge / 4, 8 + huge),
                 std::string("\0\0\x80\x3f\0\0\0\x40", 8)));
  std::filesystem::resize_file(path, std::filesystem::file_size(path) + huge);
  const int64_t before = xlme::testing::peak_rss_mib();
  const auto header = read_safetensors_header(path);
  ASSERT_EQ(header.tensors.size(), 2u);
  EXPECT_EQ(header.tensors.at("extra").shape, std::vector<int64_t>{int64_t(huge / 4)});
  EXPECT_EQ(header.tensors.at("extra").dtype, torch::kFloat32);
  const auto content = read_safetensors(path, {"a"});
  ASSERT_EQ(content.tensors.size(), 1u);
  EXPECT_TRUE(content.tensors.at("a").equal(torch::tensor({1.0f, 2.0f})));
  EXPECT_LT(xlme::testing::peak_rss_mib() - before, 256) << "the 1 GiB tensor was read";
  EXPECT_TRUE(contains_all(error_message([&] { read_safetensors(path, {"b"}); }),
                           {"safetensors file '" + path + "' has no tensor 'b'"}));
}

TEST(Json, ParsesAtMostTheDepthLimitAndSaysWhatIsWrong) {
  EXPECT_EQ(parse_json<nlohmann::json>(nested_json_array(kMaxJsonDepth), "x.json").dump(),
            nested_json_array(kMaxJsonDepth));
  const std::string deepest =
      std::string(kMaxJsonDepth - 1, '[') + R"({"a": 1})" + std::string(kMaxJsonDepth - 1, ']');
  // The value inside the deepest object is read too.
  EXPECT_EQ(
      parse_json<nlohmann::json>(deepest, "x.json").dump(),
      std::string(kMaxJsonDepth - 1, '[') + R"({"a":1})" + std::string(kMaxJsonDepth - 1, ']'));
  EXPECT_TRUE(contains_all(error_message([] {
                             parse_json<nlohmann::json>(nested_json_array(kMaxJsonDepth + 1),
                                                        "file 'x.json'");
                           }),
                           {"file 'x.json' is nested too deeply: more than 64 levels"}));
  EXPECT_TRUE(contains_all(error_message([] {
                             parse_json<nlohmann::ordered_json>(
                                 R"({"a": [{"b": )" + nested_json_array(70) + "}]}",
                                 "file 'x.json'");
                           }),
                           {"file 'x.json' is nested too deeply"}));
  // The parser's message repeats the offending token; it is cut.
  const std::string message = error_message(
      [] { parse_json<nlohmann::json>("\"" + std::string(1000000, 'x'), "file 'x.json'"); });
  EXPECT_TRUE(
      contains_all(message, {"file 'x.json' is not valid JSON: [json.exception.parse_error"}));
  EXPECT_LT(message.size(), 400u);
}

TEST(Json, DescribesValuesByKindAndABoundedStart) {
  EXPECT_EQ(describe_json(nlohmann::json(4)), "an integer 4");
  EXPECT_EQ(describe_json(nlohmann::json(-2.5)), "a number -2.5");
  EXPECT_EQ(describe_json(nlohmann::json("F8")), "a string \"F8\"");
  EXPECT_EQ(describe_json(nlohmann::json(true)), "a boolean true");
  EXPECT_EQ(describe_json(nlohmann::json(nullptr)), "null");
  EXPECT_EQ(describe_json(nlohmann::json::parse(R"([1, [2, 3], {"a": "b"}])")),
            R"(a list [1, [2, 3], {"a": "b"}])");
  // Cut at kJsonExcerpt characters, with the count of what the value holds.
  nlohmann::json long_list = nlohmann::json::array();
  for (int i = 0; i < 100000; ++i) long_list.push_back(i);
  const std::string list = describe_json(long_list);
  EXPECT_EQ(list.rfind("a list [0, 1, 2, 3, ", 0), 0u) << list;
  EXPECT_TRUE(contains_all(list, {"... (100000 items)"}));
  EXPECT_LT(list.size(), kJsonExcerpt + 40);
  const std::string text = describe_json(nlohmann::json(std::string(1000000, 'y')));
  EXPECT_EQ(text, "a string \"" + std::string(kJsonExcerpt - 1, 'y') + "...");
  // A value deeper than the limit (built in memory, not parsed) is walked to the limit only.
  nlohmann::json deep = nlohmann::json::array();
  for (int i = 0; i < 1000; ++i) deep = nlohmann::json::array({deep});
  const std::string nested = describe_json(deep);
  EXPECT_EQ(nested.rfind("a list " + std::string(kMaxJsonDepth, '[') + "...]]]", 0), 0u) << nested;
  EXPECT_TRUE(contains_all(nested, {"... (1 item)"}));
  // A cut never splits a UTF-8 character: the 2-byte "é" that would straddle it goes whole.
  EXPECT_EQ(json_excerpt(nlohmann::json(std::string(78, 'a') + "\xc3\xa9" + std::string(100, 'b'))),
            "\"" + std::string(78, 'a') + "...");
}

}  // namespace
}  // namespace xlme::checkpoint
