"""The embedded emulator: moto in server mode, the local Kubernetes API, and the pipeline driven as Lambda would."""
