"""The engine: the any-thread API (core.py), its frozen configuration (config.py), the mailbox
to the engine thread, the engine thread's body (thread.py), request handles and the friendly
facade."""
