"""The local store (an OCI image layout): references, tags, the artifacts whose subject is a bundle, gc."""
