// The source of rdmaps_test_pch (tests/CMakeLists.txt): the target exists to
// own the precompiled header every test binary reuses; it defines nothing.
