#include "launch/safetensors.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace dcp::launch {
namespace {

SafetensorsFile Sample() {
  SafetensorsFile file;
  file.tensors["a"] = MakeTensor<float>({2, 3}, {1, 2, 3, 4, 5, 6.5f});
  file.tensors["b"] = MakeTensor<int32_t>({3}, {-1, 0, 7});
  file.tensors["c"] = MakeTensor<bf16>({2}, {float_to_bf16(1.5f), float_to_bf16(-2.0f)});
  file.tensors["empty"] = MakeTensor<float>({0, 4}, {});
  file.metadata["route"] = "dense_mha";
  return file;
}

// A file image with a hand-written header (for the defects the writer cannot produce).
std::string Image(const std::string& header, const std::string& data) {
  const uint64_t length = header.size();
  return std::string(reinterpret_cast<const char*>(&length), 8) + header + data;
}

std::string Message(const std::string& image) {
  absl::StatusOr<SafetensorsFile> file = ParseSafetensors(image, "x.safetensors");
  EXPECT_FALSE(file.ok());
  if (!file.ok()) EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  return file.ok() ? "" : std::string(file.status().message());
}

TEST(SafetensorsTest, RoundTripInMemory) {
  const SafetensorsFile original = Sample();
  absl::StatusOr<std::string> image = SerializeSafetensors(original);
  ASSERT_TRUE(image.ok()) << image.status();
  uint64_t header_length;
  std::memcpy(&header_length, image->data(), 8);
  EXPECT_EQ(header_length % 8, 0u) << "the header is padded to 8 bytes";
  absl::StatusOr<SafetensorsFile> back = ParseSafetensors(*image, "mem");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->tensors.size(), original.tensors.size());
  for (const auto& [name, tensor] : original.tensors) {
    const Tensor& other = back->tensors.at(name);
    EXPECT_EQ(other.dtype, tensor.dtype) << name;
    EXPECT_EQ(other.shape, tensor.shape) << name;
    EXPECT_EQ(other.data, tensor.data) << name;
  }
  EXPECT_EQ(back->metadata, original.metadata);
}

TEST(SafetensorsTest, HeaderIsStandardSafetensors) {
  absl::StatusOr<std::string> image = SerializeSafetensors(Sample());
  ASSERT_TRUE(image.ok());
  uint64_t length;
  std::memcpy(&length, image->data(), 8);
  const nlohmann::json header = nlohmann::json::parse(image->substr(8, length));
  EXPECT_EQ(header["a"]["dtype"], "F32");
  EXPECT_EQ(header["a"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(header["b"]["dtype"], "I32");
  EXPECT_EQ(header["c"]["dtype"], "BF16");
  EXPECT_EQ(header["__metadata__"]["route"], "dense_mha");
}

TEST(SafetensorsTest, FileRoundTripIsAtomic) {
  const std::string path = ::testing::TempDir() + "/safetensors_test.safetensors";
  std::remove(path.c_str());
  ASSERT_TRUE(WriteSafetensors(path, Sample()).ok());
  absl::StatusOr<SafetensorsFile> back = ReadSafetensors(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->tensors.at("a").as<float>()[5], 6.5f);
  // No temporary file is left beside it.
  int entries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(::testing::TempDir())) {
    entries += entry.path().string().find("safetensors_test.safetensors.tmp") != std::string::npos;
  }
  EXPECT_EQ(entries, 0);
  // A folder that does not exist: an error, nothing written.
  EXPECT_FALSE(
      WriteSafetensors(::testing::TempDir() + "/no/such/dir/x.safetensors", Sample()).ok());
  std::remove(path.c_str());
}

TEST(SafetensorsTest, MissingFileIsNotFound) {
  absl::StatusOr<SafetensorsFile> file = ReadSafetensors("/nonexistent/problem.safetensors");
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(file.status().message().find("/nonexistent/problem.safetensors"), std::string::npos);
}

TEST(SafetensorsTest, RejectsBrokenFiles) {
  const std::string good = *SerializeSafetensors(Sample());
  EXPECT_NE(Message("").find("shorter than the 8-byte header length"), std::string::npos);
  EXPECT_NE(Message(good.substr(0, 20)).find("header length"), std::string::npos);
  EXPECT_NE(Message(good.substr(0, good.size() - 4)).find("truncated"), std::string::npos);
  EXPECT_NE(Message(good + "xx").find("cover"), std::string::npos);
  EXPECT_NE(Message(Image("{not json", "")).find("not a JSON object"), std::string::npos);
  EXPECT_NE(Message(Image("[1, 2]", "")).find("not a JSON object"), std::string::npos);
  EXPECT_NE(Message(Image(R"({"a": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}})", "xx"))
                .find("dtype 'F16'"),
            std::string::npos);
  EXPECT_NE(
      Message(Image(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}})", "xxxx"))
          .find("needs 8 bytes"),
      std::string::npos);
  EXPECT_NE(
      Message(Image(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", "xxxx"))
          .find("non-negative integers"),
      std::string::npos);
  EXPECT_NE(Message(Image(R"({"a": {"dtype": "F32", "shape": [1]}})", "xxxx"))
                .find("needs dtype, shape and data_offsets"),
            std::string::npos);
  EXPECT_NE(Message(Image(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                              "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                          "xxxx"))
                .find("overlap"),
            std::string::npos);
  EXPECT_NE(Message(Image(R"({"__metadata__": {"k": 3}})", "")).find("must be a string"),
            std::string::npos);
  // The JSON parser would stop at a NUL and ignore what follows it; only spaces may pad.
  EXPECT_NE(
      Message(Image(std::string("{}\0 garbage {{{", 16), "")).find("NUL byte at header offset 2"),
      std::string::npos);
}

// A path that is not a regular file is refused by name before it is read (reading a directory
// threw; a FIFO without a writer or /dev/zero would never end).
TEST(SafetensorsTest, RefusesPathsThatAreNotRegularFiles) {
  absl::StatusOr<SafetensorsFile> folder = ReadSafetensors(::testing::TempDir());
  ASSERT_FALSE(folder.ok());
  EXPECT_EQ(folder.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(folder.status().message().find("is a directory"), std::string::npos)
      << folder.status().message();
  absl::StatusOr<SafetensorsFile> device = ReadSafetensors("/dev/zero");
  ASSERT_FALSE(device.ok());
  EXPECT_NE(device.status().message().find("'/dev/zero' is not a regular file"), std::string::npos)
      << device.status().message();
}

// Finding 4: JSON keeps the last of two equal keys; the reader refuses the ambiguity.
TEST(SafetensorsTest, RejectsDuplicateTensorNamesAndMetadataKeys) {
  const std::string data(8, '\0');
  const std::string twice =
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  std::string message = Message(Image(twice, data));
  EXPECT_NE(message.find("key 'a' appears twice"), std::string::npos) << message;
  const std::string metadata_twice =
      R"({"__metadata__":{"route":"x","route":"y"},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  message = Message(Image(metadata_twice, data));
  EXPECT_NE(message.find("key 'route' appears twice"), std::string::npos) << message;
  // The same name in two different objects is fine.
  const std::string distinct =
      R"({"__metadata__":{"a":"1"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_TRUE(ParseSafetensors(Image(distinct, data), "x.safetensors").ok());
}

TEST(SafetensorsTest, WriterRejectsInconsistentTensors) {
  SafetensorsFile file;
  file.tensors["a"] = MakeTensor<float>({2, 3}, {1, 2});
  EXPECT_FALSE(SerializeSafetensors(file).ok());
}

}  // namespace
}  // namespace dcp::launch
