"""Engine-independent speculation logic: which strategy (draft source, draft length) runs at each
batch size."""
