// spdlog set-up: a text or JSON-lines formatter over one stderr sink.
#include "loop/logging.hpp"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <mutex>

namespace gns {

namespace {

// One JSON object per line: {"ts":"…","level":"…","logger":"…","msg":"…"}. spdlog's pattern
// language cannot escape the message, so this is a formatter of its own.
class JsonFormatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    using namespace std::chrono;
    const auto since_epoch = msg.time.time_since_epoch();
    const auto secs = duration_cast<seconds>(since_epoch);
    const auto micros = duration_cast<microseconds>(since_epoch - secs).count();
    const std::time_t t = secs.count();
    std::tm tm{};
    gmtime_r(&t, &tm);
    char stamp[40];
    const auto n = std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
    fmt::format_to(std::back_inserter(dest), R"({{"ts":"{}.{:06d}Z","level":")",
                   std::string_view(stamp, n), micros);
    const auto level = spdlog::level::to_string_view(msg.level);
    dest.append(level.data(), level.data() + level.size());
    dest.append(std::string_view(R"(","logger":")"));
    Escape(std::string_view(msg.logger_name.data(), msg.logger_name.size()), dest);
    dest.append(std::string_view(R"(","msg":")"));
    Escape(std::string_view(msg.payload.data(), msg.payload.size()), dest);
    dest.append(std::string_view("\"}\n"));
  }

  std::unique_ptr<spdlog::formatter> clone() const override { return std::make_unique<JsonFormatter>(); }

 private:
  static void Escape(std::string_view in, spdlog::memory_buf_t& dest) {
    for (const char c : in) {
      switch (c) {
        case '"': dest.append(std::string_view("\\\"")); break;
        case '\\': dest.append(std::string_view("\\\\")); break;
        case '\n': dest.append(std::string_view("\\n")); break;
        case '\r': dest.append(std::string_view("\\r")); break;
        case '\t': dest.append(std::string_view("\\t")); break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            fmt::format_to(std::back_inserter(dest), "\\u{:04x}", static_cast<unsigned>(c));
          } else {
            dest.push_back(c);
          }
      }
    }
  }
};

std::mutex g_mutex;
LoggingConfig g_config;
spdlog::sink_ptr g_sink;

spdlog::level::level_enum LevelFor(const std::string& name) {
  const auto it = g_config.levels.find(name);
  return it == g_config.levels.end() ? g_config.level : it->second;
}

}  // namespace

void SetupLogging(const LoggingConfig& config) {
  std::lock_guard lock(g_mutex);
  g_config = config;
  g_sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  if (config.format == LoggingConfig::Format::kJson) {
    g_sink->set_formatter(std::make_unique<JsonFormatter>());
  } else {
    g_sink->set_formatter(std::make_unique<spdlog::pattern_formatter>("%Y-%m-%dT%H:%M:%S.%fZ %^%-5l%$ [%n] %v",
                                                                       spdlog::pattern_time_type::utc));
  }
  spdlog::drop_all();
  auto main_logger = std::make_shared<spdlog::logger>("supervisor", g_sink);
  main_logger->set_level(LevelFor("supervisor"));
  spdlog::set_default_logger(main_logger);
  spdlog::flush_on(spdlog::level::warn);
}

std::shared_ptr<spdlog::logger> GetLogger(const std::string& name) {
  std::lock_guard lock(g_mutex);
  if (auto existing = spdlog::get(name)) return existing;
  if (!g_sink) g_sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>(name, g_sink);
  logger->set_level(LevelFor(name));
  logger->flush_on(spdlog::level::warn);
  spdlog::register_logger(logger);
  return logger;
}

bool ParseLogLevel(const std::string& text, spdlog::level::level_enum& out) {
  static const std::pair<const char*, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},   {"warn", spdlog::level::warn},
      {"error", spdlog::level::err},   {"critical", spdlog::level::critical},
      {"off", spdlog::level::off}};
  for (const auto& [name, level] : kLevels) {
    if (text == name) {
      out = level;
      return true;
    }
  }
  return false;
}

}  // namespace gns
