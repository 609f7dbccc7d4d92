"""Case sources: typed sweep grids (cases/base_ops), model profiles (cases/models), systems."""
