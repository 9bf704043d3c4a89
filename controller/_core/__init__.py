"""The controller over its backends: deploys and their specs and revisions, capacity and routes,
recovery at start-up, and how a controller is opened.
"""
