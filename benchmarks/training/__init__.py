"""What the training benchmarks and examples share: LeNet, Fashion-MNIST-shaped
data (real IDX files or synthetic), the training modes compared (fastpar DDP,
stock DDP over gloo, one process) and a progress bar. Not part of fastpar."""
