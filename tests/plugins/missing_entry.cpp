// Test plugin "missing_entry": a real shared object that exports no torchpatch entry points.
namespace {
int unused_helper(int x) { return x + 1; }
}  // namespace

int torchpatch_test_missing_entry_dummy(int x);
int torchpatch_test_missing_entry_dummy(int x) { return unused_helper(x); }
