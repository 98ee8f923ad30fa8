"""The API's request and response schemas, one module per resource."""
