// The one source of torchpatch_plugin_pch, whose precompiled header every in-tree plugin reuses.
