"""Schema migrations, one module per version (qwenspark.io.migrate applies them)."""
