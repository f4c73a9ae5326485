"""Plain data shared by the domain, the adapters and the handlers."""
