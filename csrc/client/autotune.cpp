#include "client/autotune.hpp"

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace fdnn_client {

namespace {

constexpr const char* kHeader = "flux_dnn autotune v1";

void warn_to_stderr(const std::string& message) { std::fprintf(stderr, "%s\n", message.c_str()); }

std::atomic<WarningHandler> warning_handler{&warn_to_stderr};

std::string hex(const std::string& bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

}  // namespace

void set_warning_handler(WarningHandler handler) {
  warning_handler.store(handler ? handler : &warn_to_stderr);
}

void warn(const std::string& message) { warning_handler.load()(message); }

void AutotuneStore::set_path(const std::string& path) {
  std::lock_guard<std::mutex> lock(mutex_);
  path_ = path;
  loaded_ = false;
  choices_.clear();
}

std::string AutotuneStore::path() {
  std::lock_guard<std::mutex> lock(mutex_);
  return path_;
}

void AutotuneStore::load_locked() {
  loaded_ = true;
  if (path_.empty()) return;
  std::ifstream in(path_);
  if (!in) return;  // no file yet: keep what this process knows
  std::string line;
  if (!std::getline(in, line) || line != kHeader) {
    warn("flux_dnn: ignoring autotune file " + path_ + ": not a '" + kHeader + "' file");
    return;
  }
  std::map<std::string, int64_t> read;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    long long id;
    std::string extra;
    if (!(fields >> key >> id) || (fields >> extra)) {
      warn("flux_dnn: ignoring corrupt autotune file " + path_);
      return;
    }
    read[key] = id;
  }
  choices_ = std::move(read);
}

void AutotuneStore::save_locked() {
  if (path_.empty()) return;
  std::error_code ignored;  // a missing directory shows as the write failure below
  std::filesystem::create_directories(std::filesystem::path(path_).parent_path(), ignored);
  std::string tmp = path_ + ".tmp" + std::to_string(reinterpret_cast<uintptr_t>(this)) +
                    std::to_string(std::rand());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kHeader << '\n';
    for (const auto& [key, id] : choices_) out << key << ' ' << id << '\n';
    if (!out) {
      std::remove(tmp.c_str());
      warn("flux_dnn: could not write autotune file " + tmp);
      return;
    }
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    std::remove(tmp.c_str());
    warn("flux_dnn: could not replace autotune file " + path_);
  }
}

std::optional<int64_t> AutotuneStore::lookup(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!loaded_) load_locked();
  auto it = choices_.find(hex(key));
  if (it == choices_.end()) return std::nullopt;
  return it->second;
}

void AutotuneStore::record(const std::string& key, int64_t algo_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  load_locked();  // re-read: another process may have recorded choices since
  choices_[hex(key)] = algo_id;
  save_locked();
}

size_t AutotuneStore::size() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!loaded_) load_locked();
  return choices_.size();
}

AutotuneStore& autotune_store() {
  static auto* store = new AutotuneStore();
  return *store;
}

}  // namespace fdnn_client
