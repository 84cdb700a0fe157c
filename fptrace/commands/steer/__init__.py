"""`fptrace steer`: add a vector to the residual stream and measure what changes."""
