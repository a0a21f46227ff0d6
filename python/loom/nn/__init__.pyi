from loom.nn import functional as functional
