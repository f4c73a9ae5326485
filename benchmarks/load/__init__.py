"""Load figures (issue 19): the packer's throughput through its queue, and 1,000 pods created → all bound."""
