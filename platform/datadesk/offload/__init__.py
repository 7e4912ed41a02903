"""Result offload: large tool results become artifacts; the model sees a preview."""
