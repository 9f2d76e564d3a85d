#include "core/kv_cache_format.h"

#include "core/status.h"

namespace dcp {

const char* kv_cache_dtype_name(KvCacheDType dtype) {
  switch (dtype) {
    case KvCacheDType::kBF16: return "bf16";
    case KvCacheDType::kFp8DsMla: return "fp8_ds_mla";
  }
  return "?";
}

absl::Status ParseKvCacheDType(const std::string& text, KvCacheDType* dtype) {
  if (text == "bf16") {
    *dtype = KvCacheDType::kBF16;
  } else if (text == "fp8_ds_mla") {
    *dtype = KvCacheDType::kFp8DsMla;
  } else {
    return DCP_ERROR(InvalidArgument, "kv_cache_dtype must be bf16 or fp8_ds_mla, got '%s'",
                     text);
  }
  return absl::OkStatus();
}

absl::Status CheckKvCacheDTypeSupported(KvCacheDType dtype, const char* what) {
  switch (dtype) {
    case KvCacheDType::kBF16:
    case KvCacheDType::kFp8DsMla:
      return absl::OkStatus();
  }
  return DCP_ERROR(InvalidArgument,
                   "%s: KV cache format %d is not supported by this build (bf16, fp8_ds_mla)",
                   what, static_cast<int>(dtype));
}

}  // namespace dcp
