"""Models: loading, the compact forward, the lean tokenizer, the draft vocabulary, chat templates."""
