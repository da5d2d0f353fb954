"""Text: incremental UTF-8-safe detokenization and stop strings (detok.py), chat templates
(chat_template.py)."""
