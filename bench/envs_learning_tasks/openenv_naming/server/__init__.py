"""The naming environment's server side (OpenEnv's create_app over `NamingEnvironment`)."""
