// Algorithm choices found by benchmark mode, kept on disk so the next process does not search
// again. Keyed by shim, vendor version, device name and the problem's bytes. The file is a
// text file rewritten atomically (temp file + rename); a corrupt or foreign file is ignored
// with a warning and replaced on the next write, never trusted.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>

namespace fdnn_client {

// Where the client's warnings go (a corrupt autotune file, a stale choice): the binding sets
// it (_core: Python's warnings); by default they go to stderr. It may throw.
using WarningHandler = void (*)(const std::string& message);
void set_warning_handler(WarningHandler handler);
void warn(const std::string& message);

class AutotuneStore {
 public:
  // An empty path disables persistence (choices are still remembered in memory).
  void set_path(const std::string& path);
  std::string path();
  std::optional<int64_t> lookup(const std::string& key);
  void record(const std::string& key, int64_t algo_id);
  size_t size();

 private:
  void load_locked();
  void save_locked();
  std::mutex mutex_;
  std::string path_;
  bool loaded_ = false;
  std::map<std::string, int64_t> choices_;
};

AutotuneStore& autotune_store();

}  // namespace fdnn_client
