"""Side-by-side measurements of the framework against its peers; nothing in the product imports this."""
