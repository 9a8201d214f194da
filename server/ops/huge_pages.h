// The server's heap on transparent huge pages.
//
// A stream's recovery allocates its records, token codes and indexes at
// once (a camera-hour: ~600 MiB in ~260,000 fresh 4 KiB pages), and on a
// virtual machine every first touch of a page is a fault that exits to the
// hypervisor. glibc backs its heap with transparent huge pages when the
// tunable glibc.malloc.hugetlb=1 is set (glibc >= 2.35; it madvises
// MADV_HUGEPAGE and grows the heap in 2 MiB steps). Tunables are read only
// when a process starts, so the server starts itself again with it set
// (kvmem-server --huge_pages: on, off, or auto = on with --store=rados:).
// Measured on a camera-hour's RocksDB restart (docs/durable-tier.md): the
// engine's open 5.6 s -> 1.9-2.2 s, page faults 260k -> 6k; and the cost:
// 7B recall + delivery ~1-2 ms slower at p50 with glibc's huge-page mode.
#ifndef KVMEM_SERVER_OPS_HUGE_PAGES_H_
#define KVMEM_SERVER_OPS_HUGE_PAGES_H_

#include <string>
#include <vector>

namespace kvmem {

// What the kernel does with madvised huge pages: "always", "madvise" or
// "never" (the bracketed word of `enabled_file`); empty when unreadable.
std::string TransparentHugePageMode(
    const char* enabled_file = "/sys/kernel/mm/transparent_hugepage/enabled");

// GLIBC_TUNABLES with glibc.malloc.hugetlb=1 added to `current` (which may
// be null); empty when `current` already sets glibc.malloc.hugetlb (the
// caller's choice stands).
std::string TunablesWithHugePages(const char* current);

// Set in the environment of the started-again server: it never starts
// itself again (a secure exec, setuid or file capabilities, drops glibc's
// tunables, which would otherwise loop).
inline constexpr char kHugePagesReexecMarker[] = "KVMEM_HUGE_PAGES_REEXEC";

// Starts this program again (same pid, same arguments, the binary's
// resolved path) with the heap on huge pages, when the kernel offers them
// ("always" or "madvise"), the environment does not set
// glibc.malloc.hugetlb already, the exec is not a secure one, this is not
// the started-again process, and every file in `reread` is a regular file
// (a pipe would be empty the second time). Returns only when it did not:
// a line for the log saying which heap the server runs on, and why.
std::string StartWithHugePages(char** argv,
                               const std::vector<std::string>& reread);

}  // namespace kvmem

#endif  // KVMEM_SERVER_OPS_HUGE_PAGES_H_
