"""mmptm."""
