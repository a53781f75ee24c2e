#include "pipeflow/core/json.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "../support/error_of.h"
#include "pipeflow/core/config.h"
#include "pipeflow/core/file.h"
#include "../support/temp_dir.h"

namespace pipeflow {
namespace {

using testing::error_of;

std::string nested_arrays(int depth) {
  std::string text(static_cast<std::size_t>(depth), '[');
  text.append(static_cast<std::size_t>(depth), ']');
  return text;
}

// What short_dump shows of a value that opens more than 57 arrays.
const std::string kCutBrackets = fmt::format("{:[>57}...", "");

TEST(Json, NestingUpToTheLimitParses) {
  EXPECT_EQ(parse_json(nested_arrays(kMaxJsonDepth), "n.json").dump().size(), 2u * kMaxJsonDepth);
}

TEST(Json, NestingPastTheLimitIsAnErrorNamingSourceAndLimit) {
  // 100 000 levels overflowed the stack in nlohmann's dump (SIGSEGV) before the limit.
  for (int depth : {kMaxJsonDepth + 1, 100'000}) {
    EXPECT_EQ(error_of([&] { parse_json(nested_arrays(depth), "deep.json"); }),
              "deep.json: JSON nested deeper than the limit of 64 levels (arrays and objects within each other), far "
              "more than any configuration, schedule, profile or trace needs: is it the right file?");
  }
  std::string deep_objects = "{\"a\":";
  deep_objects.append(100'000, '[');
  EXPECT_NE(error_of([&] { Config::parse(deep_objects, "c.json"); }).find("c.json: JSON nested deeper"), std::string::npos);
}

// nlohmann keeps the last of two equal keys; pipeflow refuses them, naming
// the key's path and the first value ("steps": 3, "steps": 5 trained 5).
TEST(Json, AKeyTwiceInOneObjectIsAnErrorNamingItsPath) {
  EXPECT_EQ(error_of([] { parse_json(R"({"steps": 3, "steps": 5})", "run.json"); }),
            "run.json: key steps appears twice in one object (first 3): JSON keys must be unique; keep the one you "
            "mean");
  EXPECT_EQ(error_of([] { parse_json(R"({"pipeline": {"stages": 2, "x": [1, {"a": 1, "a": 2}]}})", "run.json"); }),
            "run.json: key pipeline.x[1].a appears twice in one object (first 1): JSON keys must be unique; keep the "
            "one you mean");
  // Equal keys in different objects are fine, and the document is whole.
  const nlohmann::json json = parse_json(R"({"a": {"k": 1}, "b": {"k": [true, null, 2.5, "s"]}, "k": -3})", "x");
  EXPECT_EQ(json, nlohmann::json::parse(R"({"a": {"k": 1}, "b": {"k": [true, null, 2.5, "s"]}, "k": -3})"));
  EXPECT_EQ(parse_json("7", "x"), 7);
  EXPECT_EQ(error_of([] { parse_json("{\"a\": }", "bad.json"); }).rfind("bad.json: not valid JSON: ", 0), 0u);
}

TEST(Json, ShortDumpIsBoundedForHugeAndDeepValues) {
  EXPECT_EQ(short_dump(nlohmann::json::parse(R"({"a":[1,"x"]})")), R"({"a":[1,"x"]})");
  nlohmann::json huge = nlohmann::json::array();
  for (int i = 0; i < 100'000; ++i) huge.push_back(i);
  EXPECT_EQ(short_dump(huge), "[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,...");
  nlohmann::json deep = nlohmann::json::array();
  for (int i = 0; i < 10'000; ++i) deep = nlohmann::json::array({std::move(deep)});
  EXPECT_EQ(short_dump(deep), kCutBrackets);
}

TEST(Json, AConfigurationOfDeepValueReportsItShort) {
  const Config config = Config::parse("{\"stages\": " + nested_arrays(60) + "}", "c.json");
  EXPECT_EQ(error_of([&] { config.require<int>("stages"); }),
            "c.json: stages must be an integer, got " + kCutBrackets);
}

// nlohmann's message quoted the token it stopped at whole: a 100 KB string,
// or the first line of a file that is not JSON (/etc/passwd, named by a trace).
TEST(Json, AParseErrorGivesThePlaceAndAShortExcerptOfTheToken) {
  const std::string open_string = "{\"model\": \"" + std::string(100'000, 'A') + "\n";
  EXPECT_EQ(testing::error_of([&] { parse_json(open_string, "c.json"); }),
            "c.json: not valid JSON: parse error at line 2, column 0: syntax error while parsing value - invalid string: "
            "control character U+000A (LF) must be escaped to \\u000A or \\n; last read: \"\\x22" +
                std::string(59, 'A') + "\"... (100009 bytes)");
  EXPECT_EQ(testing::error_of([&] { parse_json("root:x:0:0:root:/root:/bin/bash\n", "passwd"); }),
            "passwd: not valid JSON: parse error at line 1, column 1: syntax error while parsing value - invalid "
            "literal; last read: \"r\"");
  EXPECT_EQ(testing::error_of([&] { parse_json("[1e999999]", "n.json"); }),
            "n.json: not valid JSON: number overflow parsing \"1e999999\"");
  EXPECT_EQ(testing::error_of([&] { parse_json("{\"a\" 1}", "k.json"); }),
            "k.json: not valid JSON: parse error at line 1, column 6: syntax error while parsing object separator - "
            "unexpected number literal; expected ':'");
}

TEST(BoundedRead, DevZeroFailsAtTheLimit) {
  EXPECT_EQ(error_of([] { read_file("/dev/zero", 1000, "configuration file"); }),
            "/dev/zero: more than 1000 bytes, the limit for a configuration file: is it the right file?");
  EXPECT_NE(error_of([] { Config::load("/dev/zero"); }).find("more than 16777216 bytes"), std::string::npos);
}

TEST(BoundedRead, AFileAtTheLimitIsRead) {
  const auto path = std::filesystem::path(pipeflow::testing::make_temp_dir()) / "bounded.txt";
  write_file_atomic(path, std::string(1000, 'x'));
  EXPECT_EQ(read_file(path, 1000, "test file").size(), 1000u);
  EXPECT_NE(error_of([&] { read_file(path, 999, "test file"); }).find("more than 999 bytes"), std::string::npos);
}

TEST(QuotedExcerpt, CutsLongAndEscapesBinaryText) {
  EXPECT_EQ(quoted_excerpt("0F1"), "\"0F1\"");
  EXPECT_EQ(quoted_excerpt(std::string(100'000, 'a')), fmt::format("\"{:a>200}\"... (100000 bytes)", ""));
  EXPECT_EQ(quoted_excerpt(std::string(100'000, 'a'), 40), fmt::format("\"{:a>40}\"... (100000 bytes)", ""));
  EXPECT_EQ(quoted_excerpt(std::string("\x01\xff\"z", 4)), "\"\\x01\\xff\\x22z\"");
  // UTF-8 reads as it is, but for its controls (U+0085) and what is cut or not UTF-8.
  EXPECT_EQ(quoted_excerpt("donn\xc3\xa9" "es\xc2\x85\xed\xa0\x80"), "\"donn\xc3\xa9" "es\\xc2\\x85\\xed\\xa0\\x80\"");
  EXPECT_EQ(quoted_excerpt("\xc3\xa9\xc3\xa9", 3), "\"\xc3\xa9\\xc3\"... (4 bytes)");
}

}  // namespace
}  // namespace pipeflow

namespace pipeflow {
namespace {

// Found by fuzz/yaml_config_fuzz: YAML takes any bytes, JSON's strings are
// UTF-8; a string of other bytes escaped as the JSON library's own exception.
TEST(Yaml, AStringThatIsNotUtf8IsAnError) {
  EXPECT_THROW(parse_yaml("name: \"a\xff\"\n", "bad.yaml"), Error);
  EXPECT_THROW(parse_yaml("\xc3: 1\n", "bad.yaml"), Error);
  EXPECT_THROW(parse_yaml("a: \"\xf7\x80\x80\x80\"\n", "bad.yaml"), Error);  // past U+10FFFF
  EXPECT_THROW(parse_yaml("a: \"\xc0\xaf\"\n", "bad.yaml"), Error);          // overlong
  EXPECT_THROW(parse_yaml("a: \"\xed\xa0\x80\"\n", "bad.yaml"), Error);     // a surrogate
  EXPECT_EQ(parse_yaml("name: \"caf\xc3\xa9\"\n", "ok.yaml")["name"], "caf\xc3\xa9");
}

}  // namespace
}  // namespace pipeflow
