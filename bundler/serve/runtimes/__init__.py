"""`bundle serve --runtime`: a third-party runtime governed behind specbundle's front door."""
