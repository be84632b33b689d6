// /docs: Swagger UI on this gateway's OpenAPI document. A file rather than the usual
// inline script, so the page's Content-Security-Policy allows no inline script; no
// validator badge, which would fetch an image from validator.swagger.io.
"use strict";
window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
