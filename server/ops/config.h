// kvmem-server's config file (TOML, read with toml++):
//
//   [server]            # any kvmem-server flag, by name, typed as TOML
//   listen = "0.0.0.0:50551"
//   data_dir = "/var/lib/kvmem"
//   wal_sync = "interval"
//
//   [stream_defaults]   # policy fields a stream's OpenStream leaves zero
//   hot_window_tokens = 512
//   frames_per_block = 4
//   warm_budget_bytes = 1048576
//
// Flags on the command line override the file (it is applied first); with
// no file the embedded defaults apply. Unknown sections and keys, and values
// that do not parse as their flag's type, are errors naming the key and its
// line.
#ifndef KVMEM_SERVER_OPS_CONFIG_H_
#define KVMEM_SERVER_OPS_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "engine/types.h"

namespace kvmem {

// Every value given for --NAME in argv (as --NAME=V, --NAME V, or with one
// dash), in order, up to a "--"; read before absl parses the command line.
std::vector<std::string> FlagValuesFromArgs(int argc, char** argv,
                                            absl::string_view name);

// The value of --config=FILE or --config FILE in argv ("" when absent; the
// last one given); read before absl parses the command line so that flags
// win.
std::string ConfigPathFromArgs(int argc, char** argv);

// Applies a config file's text: sets the [server] keys' flags (flags defined
// in server/) and fills *stream_defaults from [stream_defaults]. origin names
// the file in messages. INVALID_ARGUMENT on any error (nothing is half
// applied to *stream_defaults; flags set before the error stay set, and the
// server exits).
absl::Status ApplyConfigText(const std::string& text, const std::string& origin,
                             StreamConfig* stream_defaults);
absl::Status ApplyConfigFile(const std::string& path,
                             StreamConfig* stream_defaults);

// OK when streams opened under these defaults can be valid (checked on a
// one-layer sample geometry); otherwise the engine's message prefixed with
// "[stream_defaults]".
absl::Status ValidateStreamDefaults(const StreamConfig& stream_defaults);

// The effective configuration as a TOML file ApplyConfigText accepts: every
// server flag with its current value, then the stream defaults (unset ones
// as comments showing the built-in default).
std::string EffectiveConfigToml(const StreamConfig& stream_defaults);

}  // namespace kvmem

#endif  // KVMEM_SERVER_OPS_CONFIG_H_
