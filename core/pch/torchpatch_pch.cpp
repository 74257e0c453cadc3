// The one source of torchpatch_pch, whose precompiled header every target of the tree reuses.
