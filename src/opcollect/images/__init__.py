"""Container images: pins, build through the Docker engine, labels, input hash."""
