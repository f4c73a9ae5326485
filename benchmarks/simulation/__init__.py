"""The simulator over the Alibaba GPU trace: how long the whole replay takes, and what it finds."""
