"""Model access: the OpenAI-compatible client, the scripted model, token counting."""


def configured_model(settings):
    """The configured LLM (`settings.llm`), or the clearly labelled scripted demo when none is set."""
    if settings.llm_configured:
        from datadesk.llm.client import OpenAIChatModel

        return OpenAIChatModel(settings.llm)
    from datadesk.llm.demo import demo_model

    return demo_model()
