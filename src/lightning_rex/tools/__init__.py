"""Tools around training: the heterogeneity emulator and the real-run benchmark."""
