// DevOptions (dev_options.h): parsing, the process-wide copy, and the one place the environment is read.
#include "fa2/dev_options.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace fa2 {

const char* const kDevOptionNames[] = {
    "arch_specific_kernels", "sm90_schedule",    "persistent_forward_ctas", "fwd_cluster",
    "tile_order_tail",       "sm90_backward",    "sm90_ws_backward",        "key_bias_backward",
    "bwd_small_tiles",       "bwd_gqa_grouping", "bwd_gqa_accumulate",      "bwd_tail_split",
    "cpu_bf16_gemm",         "sm90_varlen",      "sm90_dropout",            "sm90_ws_dropout",
    "dense_decode",          "bwd_programmatic_main", "varlen_stage_masks", "varlen_dq_blocks",
    "paged_kv_in_place",     "cpu_head_tiles",   "cpu_key_splits"};
const int kNumDevOptions = int(sizeof(kDevOptionNames) / sizeof(kDevOptionNames[0]));

namespace {

const char* message(std::string s) {  // (valid until this thread's next message)
  thread_local std::string buffer;
  buffer = std::move(s);
  return buffer.c_str();
}

bool parse_bool(const char* v, bool* out) {
  for (const char* t : {"1", "true", "True", "on", "yes"}) {
    if (std::strcmp(v, t) == 0) return *out = true, true;
  }
  for (const char* f : {"0", "false", "False", "off", "no"}) {
    if (std::strcmp(v, f) == 0) return *out = false, true;
  }
  return false;
}

bool parse_int(const char* v, long lo, long hi, int* out) {
  char* end = nullptr;
  const long value = std::strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || value < lo || value > hi) return false;
  *out = int(value);
  return true;
}

std::string schedule_choices() {
  std::string all;
  for (const char* n : kSm90ScheduleNames) all += std::string(all.empty() ? "" : ", ") + n;
  return all;
}

// The variables each option had before FA2_DEV_OPTIONS, still honored (read here only) so that older A/B command
// lines keep selecting what they named: a switch set to anything but "" or "0" means `when_set`; the modes take
// "0" / "1" (anything else: auto); the schedule and the CTA count their value.
struct LegacyVariable {
  const char* env;
  const char* key;
  const char* when_set;  // the option's value when the variable is set; nullptr: the variable's own value
};
constexpr LegacyVariable kLegacyVariables[] = {
    {"FA2_DISABLE_ARCH_SPECIFIC", "arch_specific_kernels", "0"},
    {"FA2_SM90_SCHEDULE", "sm90_schedule", nullptr},
    {"FA2_PERSISTENT_FWD_CTAS", "persistent_forward_ctas", nullptr},
    {"FA2_NO_FWD_CLUSTER", "fwd_cluster", "0"},
    {"FA2_NO_TILE_ORDER_TAIL", "tile_order_tail", "0"},
    {"FA2_DISABLE_SM90_BACKWARD", "sm90_backward", "0"},
    {"FA2_DISABLE_SM90_WS_BACKWARD", "sm90_ws_backward", "0"},
    {"FA2_DISABLE_KEY_BIAS_BWD", "key_bias_backward", "0"},
    {"FA2_BWD_SMALL_TILES", "bwd_small_tiles", "1"},
    {"FA2_BWD_GQA_GROUPING", "bwd_gqa_grouping", nullptr},
    {"FA2_BWD_GQA_NO_ACCUMULATE", "bwd_gqa_accumulate", "0"},
    {"FA2_BWD_TAIL_SPLIT", "bwd_tail_split", nullptr},
    {"FA2_CPU_BF16_GEMM", "cpu_bf16_gemm", nullptr},
};

// A legacy variable applied as it was read before (lenient: a value it did not take leaves the default, except a
// schedule name, which was an error then too).
const char* apply_legacy_variable(const LegacyVariable& var, const char* v, DevOptions* options) {
  if (var.when_set != nullptr) {
    if (*v == '\0' || std::strcmp(v, "0") == 0) return nullptr;
    return set_dev_option(options, var.key, var.when_set);
  }
  if (std::strcmp(var.key, "sm90_schedule") == 0) {
    if (*v == '\0') return nullptr;
    if (set_dev_option(options, var.key, v) == nullptr) return nullptr;
    return message(std::string("fa2: FA2_SM90_SCHEDULE=") + v + " is not an sm_90a schedule (one of " +
                   schedule_choices() + ")");
  }
  if (std::strcmp(var.key, "cpu_bf16_gemm") == 0) {  // (on unless "0")
    options->cpu_bf16_gemm = std::strcmp(v, "0") != 0;
    return nullptr;
  }
  if (std::strcmp(var.key, "persistent_forward_ctas") == 0) {
    int ctas = -1;
    options->persistent_forward_ctas = parse_int(v, 0, 1 << 30, &ctas) ? ctas : -1;
    return nullptr;
  }
  const int mode = std::strcmp(v, "0") == 0 ? 0 : std::strcmp(v, "1") == 0 ? 1 : -1;
  (var.key[4] == 'g' ? options->bwd_gqa_grouping : options->bwd_tail_split) = mode;  // bwd_gqa_... / bwd_tail_...
  return nullptr;
}

// The options the environment gives: FA2_DEV_OPTIONS over the legacy variables over the defaults.
const char* options_from_environment(DevOptions* options) {
  *options = DevOptions{};
  for (const LegacyVariable& var : kLegacyVariables) {
    const char* v = std::getenv(var.env);
    if (v == nullptr) continue;
    if (const char* e = apply_legacy_variable(var, v, options)) return e;
  }
  const char* text = std::getenv("FA2_DEV_OPTIONS");
  if (text == nullptr) return nullptr;
  if (const char* e = parse_dev_options(text, options)) {
    return message(std::string("fa2: FA2_DEV_OPTIONS: ") + e);
  }
  return nullptr;
}

struct ProcessOptions {
  std::mutex mutex;
  bool read = false;  // the environment was read
  DevOptions options;
  std::string environment_error;  // what FA2_DEV_OPTIONS got wrong (until set_dev_options replaces it)
};
ProcessOptions& process_options() {
  static ProcessOptions state;
  return state;
}

}  // namespace

const char* set_dev_option(DevOptions* o, const char* key, const char* value) {
  bool ok = false;
  std::string k = key;
  if (k == "arch_specific_kernels") ok = parse_bool(value, &o->arch_specific_kernels);
  else if (k == "fwd_cluster") ok = parse_bool(value, &o->fwd_cluster);
  else if (k == "tile_order_tail") ok = parse_bool(value, &o->tile_order_tail);
  else if (k == "sm90_backward") ok = parse_bool(value, &o->sm90_backward);
  else if (k == "sm90_ws_backward") ok = parse_bool(value, &o->sm90_ws_backward);
  else if (k == "key_bias_backward") ok = parse_bool(value, &o->key_bias_backward);
  else if (k == "bwd_small_tiles") ok = parse_bool(value, &o->bwd_small_tiles);
  else if (k == "bwd_gqa_accumulate") ok = parse_bool(value, &o->bwd_gqa_accumulate);
  else if (k == "cpu_bf16_gemm") ok = parse_bool(value, &o->cpu_bf16_gemm);
  else if (k == "sm90_varlen") ok = parse_bool(value, &o->sm90_varlen);
  else if (k == "sm90_dropout") ok = parse_bool(value, &o->sm90_dropout);
  else if (k == "sm90_ws_dropout") ok = parse_bool(value, &o->sm90_ws_dropout);
  else if (k == "dense_decode") ok = parse_bool(value, &o->dense_decode);
  else if (k == "bwd_programmatic_main") ok = parse_bool(value, &o->bwd_programmatic_main);
  else if (k == "varlen_stage_masks") ok = parse_bool(value, &o->varlen_stage_masks);
  else if (k == "varlen_dq_blocks") ok = parse_bool(value, &o->varlen_dq_blocks);
  else if (k == "cpu_head_tiles") ok = parse_bool(value, &o->cpu_head_tiles);
  else if (k == "paged_kv_in_place") ok = parse_bool(value, &o->paged_kv_in_place);
  else if (k == "persistent_forward_ctas") ok = parse_int(value, -1, 1 << 30, &o->persistent_forward_ctas);
  else if (k == "bwd_gqa_grouping") ok = parse_int(value, -1, 1, &o->bwd_gqa_grouping);
  else if (k == "bwd_tail_split") ok = parse_int(value, -1, 1, &o->bwd_tail_split);
  else if (k == "cpu_key_splits") ok = parse_int(value, -1, 1 << 20, &o->cpu_key_splits);
  else if (k == "sm90_schedule") {
    for (int i = 0; i < int(sizeof(kSm90ScheduleNames) / sizeof(kSm90ScheduleNames[0])); ++i) {
      if (std::strcmp(value, kSm90ScheduleNames[i]) == 0) o->sm90_schedule = Sm90Schedule(i), ok = true;
    }
    if (!ok) {
      return message(std::string("fa2: unknown sm_90a schedule '") + value + "' (one of " + schedule_choices() +
                     ")");
    }
  } else {
    std::string names;
    for (int i = 0; i < kNumDevOptions; ++i) names += std::string(i ? ", " : "") + kDevOptionNames[i];
    return message("fa2: unknown development option '" + k + "' (one of " + names + ")");
  }
  if (!ok) return message("fa2: bad value '" + std::string(value) + "' for development option " + k);
  return nullptr;
}

const char* parse_dev_options(const char* text, DevOptions* options) {
  std::string all = text;
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(',', start);
    if (end == std::string::npos) end = all.size();
    const std::string item = all.substr(start, end - start);
    start = end + 1;
    if (item.find_first_not_of(" ") == std::string::npos) continue;
    const size_t eq = item.find('=');
    if (eq == std::string::npos) return message("fa2: '" + item + "' is not key=value");
    const size_t k0 = item.find_first_not_of(' '), k1 = item.find_last_not_of(' ', eq - 1);
    const std::string key = k1 >= k0 && k1 != std::string::npos ? item.substr(k0, k1 - k0 + 1) : "";
    const size_t v0 = item.find_first_not_of(' ', eq + 1), v1 = item.find_last_not_of(' ');
    const std::string value = v0 == std::string::npos ? "" : item.substr(v0, v1 - v0 + 1);
    if (const char* e = set_dev_option(options, key.c_str(), value.c_str())) return e;
  }
  return nullptr;
}

std::string dev_option_value(const DevOptions& o, const char* key) {
  const std::string k = key;
  auto b = [](bool v) { return std::string(v ? "1" : "0"); };
  if (k == "arch_specific_kernels") return b(o.arch_specific_kernels);
  if (k == "sm90_schedule") return sm90_schedule_name(o.sm90_schedule);
  if (k == "persistent_forward_ctas") return std::to_string(o.persistent_forward_ctas);
  if (k == "fwd_cluster") return b(o.fwd_cluster);
  if (k == "tile_order_tail") return b(o.tile_order_tail);
  if (k == "sm90_backward") return b(o.sm90_backward);
  if (k == "sm90_ws_backward") return b(o.sm90_ws_backward);
  if (k == "key_bias_backward") return b(o.key_bias_backward);
  if (k == "bwd_small_tiles") return b(o.bwd_small_tiles);
  if (k == "bwd_gqa_grouping") return std::to_string(o.bwd_gqa_grouping);
  if (k == "bwd_gqa_accumulate") return b(o.bwd_gqa_accumulate);
  if (k == "bwd_tail_split") return std::to_string(o.bwd_tail_split);
  if (k == "cpu_bf16_gemm") return b(o.cpu_bf16_gemm);
  if (k == "sm90_varlen") return b(o.sm90_varlen);
  if (k == "sm90_dropout") return b(o.sm90_dropout);
  if (k == "sm90_ws_dropout") return b(o.sm90_ws_dropout);
  if (k == "dense_decode") return b(o.dense_decode);
  if (k == "bwd_programmatic_main") return b(o.bwd_programmatic_main);
  if (k == "varlen_stage_masks") return b(o.varlen_stage_masks);
  if (k == "varlen_dq_blocks") return b(o.varlen_dq_blocks);
  if (k == "paged_kv_in_place") return b(o.paged_kv_in_place);
  if (k == "cpu_head_tiles") return b(o.cpu_head_tiles);
  if (k == "cpu_key_splits") return std::to_string(o.cpu_key_splits);
  return "";
}

const char* dev_options(DevOptions* out) {
  ProcessOptions& state = process_options();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (!state.read) {
    state.read = true;
    DevOptions from_env;
    if (const char* e = options_from_environment(&from_env)) {
      state.environment_error = e;
    } else {
      state.options = from_env;
    }
  }
  *out = state.options;
  return state.environment_error.empty() ? nullptr : message(state.environment_error);
}

void set_dev_options(const DevOptions& options) {
  ProcessOptions& state = process_options();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.read = true;  // (an explicit setting wins over the environment, which is then never read)
  state.options = options;
  state.environment_error.clear();
}

}  // namespace fa2
