// Command-line parsing for every tool in tools/ and perf/: gflags, with a
// --help that lists the tool's own flags before those of glog and gflags,
// and a --helpshort that lists the tool's own flags only.
//
//   gflags::SetUsageMessage("what the tool does\n  tool [flags] ARGS");
//   rdmaps::tools::ParseCommandLineFlags(&argc, &argv);
//
// gflags 2.2.2 sorts --help by the path of the defining file (so glog's
// "./src/logging.cc" comes first), and --helpshort lists only files named
// after the program ("/rdmaps-perf.cc"), none of ours. A tool's own flags are
// those defined outside the folders of gflags' --help and glog's
// --logtostderr. The other help flags (--helpon, --helpmatch, --helpxml,
// --version, ...) behave as gflags defines them.
//
// Thread safety: call once, from main(), before any thread starts.
#pragma once

namespace rdmaps::tools {

// gflags::ParseCommandLineFlags(argc, argv, /*remove_flags=*/true), except
// that --help/--helpfull and --helpshort print the lists above (to stdout)
// and exit 1, as gflags' do, and that an unknown flag, a numeric flag whose
// value does not fit its type (gflags' int32/uint64 range) or a double flag
// that is not a finite number exits 2 (tools/common/exit.h) quoting it.
void ParseCommandLineFlags(int* argc, char*** argv);

}  // namespace rdmaps::tools
