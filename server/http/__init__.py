"""HTTP front end: the only package that imports FastAPI or Starlette (app, routes, middleware, codecs)."""
