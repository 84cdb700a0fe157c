"""`fptrace report`: one offline HTML page of a prompt's trace, walkthrough and attribution."""
