"""`fptrace attribute`: direct logit attribution that sums to the model's logit."""
