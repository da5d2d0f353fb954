"""The model host, above the runtime: which models a request may name, which stay resident within
the memory budget, and how each is planned and built (`loading`). See docs/ARCHITECTURE.md."""
